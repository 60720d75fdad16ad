"""Reverse cumulative sum along a dimension, written with two flips around cumsum."""

import torch
import torch.nn as nn

PROFILE = "cpu"
SIZES = {
    "cpu": {"batch_size": 128, "length": 4096},
    "gpu": {"batch_size": 16384, "length": 16384},
}
batch_size = SIZES[PROFILE]["batch_size"]
length = SIZES[PROFILE]["length"]
dim = 1


class Model(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.dim = dim

    def forward(self, x):
        flipped = torch.flip(x, [self.dim])
        summed = torch.cumsum(flipped, dim=self.dim)
        return torch.flip(summed, [self.dim])


def get_inputs():
    return [torch.randn(batch_size, length)]


def get_init_inputs():
    return [dim]
