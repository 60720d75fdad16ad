"""Linear layer followed by the exact (erf) GELU written out from primitives."""

import math

import torch
import torch.nn as nn

PROFILE = "cpu"
SIZES = {
    "cpu": {"batch_size": 128, "in_features": 512, "out_features": 1024},
    "gpu": {"batch_size": 8192, "in_features": 8192, "out_features": 16384},
}
batch_size = SIZES[PROFILE]["batch_size"]
in_features = SIZES[PROFILE]["in_features"]
out_features = SIZES[PROFILE]["out_features"]


class Model(nn.Module):
    def __init__(self, in_features, out_features):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)

    def forward(self, x):
        x = self.linear(x)
        y = 0.5 * x * (1.0 + torch.erf(x / math.sqrt(2.0)))
        return y


def get_inputs():
    return [torch.randn(batch_size, in_features)]


def get_init_inputs():
    return [in_features, out_features]
