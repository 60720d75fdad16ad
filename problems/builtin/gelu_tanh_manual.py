"""GELU (tanh approximation) written out from primitives."""

import math

import torch
import torch.nn as nn

PROFILE = "cpu"
SIZES = {
    "cpu": {"batch_size": 64, "dim": 4096},
    "gpu": {"batch_size": 16384, "dim": 16384},
}
batch_size = SIZES[PROFILE]["batch_size"]
dim = SIZES[PROFILE]["dim"]


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        y = 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3))))
        return y


def get_inputs():
    return [torch.randn(batch_size, dim)]


def get_init_inputs():
    return []
