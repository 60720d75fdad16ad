"""The elementwise chain with the ReLU left out (wrong for x < -0.5)."""

import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        return (torch.sigmoid((x * 2.0 + 1.0) * 0.5) - 0.25) * 3.0
