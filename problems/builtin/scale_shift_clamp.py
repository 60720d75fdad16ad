"""Scale, shift, clamp, tanh and absolute value applied to a single tensor."""

import torch
import torch.nn as nn

PROFILE = "cpu"
SIZES = {
    "cpu": {"batch_size": 64, "dim": 4096},
    "gpu": {"batch_size": 16384, "dim": 16384},
}
batch_size = SIZES[PROFILE]["batch_size"]
dim = SIZES[PROFILE]["dim"]
scale = 1.5
shift = 0.1


class Model(nn.Module):
    def __init__(self, scale, shift):
        super().__init__()
        self.scale = scale
        self.shift = shift

    def forward(self, x):
        x = x * self.scale
        x = x + self.shift
        x = torch.clamp(x, min=-1.0, max=1.0)
        x = torch.tanh(x)
        x = torch.abs(x)
        x = x * 2.0
        return x


def get_inputs():
    return [torch.randn(batch_size, dim)]


def get_init_inputs():
    return [scale, shift]
