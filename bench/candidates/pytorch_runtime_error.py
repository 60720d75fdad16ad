"""Reshapes to a shape the input cannot take: raises in forward."""

import torch.nn as nn
import torch.nn.functional as F


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        return F.silu(x.view(-1, 3)).view_as(x)
