"""Mean squared error between two tensors, reduced to a scalar."""

import torch
import torch.nn as nn

PROFILE = "cpu"
SIZES = {
    "cpu": {"batch_size": 128, "dim": 4096},
    "gpu": {"batch_size": 16384, "dim": 16384},
}
batch_size = SIZES[PROFILE]["batch_size"]
dim = SIZES[PROFILE]["dim"]


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, predictions, targets):
        return torch.mean((predictions - targets) ** 2)


def get_inputs():
    return [torch.randn(batch_size, dim), torch.randn(batch_size, dim)]


def get_init_inputs():
    return []
