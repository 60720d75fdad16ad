"""torch.var with correction=0 over channels."""

import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        return torch.var(x, dim=1, correction=0)
