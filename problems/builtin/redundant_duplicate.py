"""Logistic function plus squared tanh, with exp and tanh each evaluated twice."""

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
        num = torch.exp(x)
        den = 1.0 + torch.exp(x)
        y = num / den
        t = torch.tanh(x) * torch.tanh(x)
        return y + t


def get_inputs():
    return [torch.randn(batch_size, dim)]


def get_init_inputs():
    return []
