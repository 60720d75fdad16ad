"""Euclidean norm of every row, from square, sum and square root."""

import torch
import torch.nn as nn

PROFILE = "cpu"
SIZES = {
    "cpu": {"batch_size": 256, "dim": 4096},
    "gpu": {"batch_size": 16384, "dim": 16384},
}
batch_size = SIZES[PROFILE]["batch_size"]
dim = SIZES[PROFILE]["dim"]


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        squares = x * x
        total = torch.sum(squares, dim=1)
        return torch.sqrt(total)


def get_inputs():
    return [torch.randn(batch_size, dim)]


def get_init_inputs():
    return []
