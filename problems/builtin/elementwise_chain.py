"""Seven point-wise operations applied one after another to a single tensor."""

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
        x = x * 2.0
        x = x + 1.0
        x = torch.relu(x)
        x = x * 0.5
        x = torch.sigmoid(x)
        x = x - 0.25
        x = x * 3.0
        return x


def get_inputs():
    return [torch.randn(batch_size, dim)]


def get_init_inputs():
    return []
