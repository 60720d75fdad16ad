"""Dense layer written as matmul with a transposed weight, bias add and ReLU."""

import math

import torch
import torch.nn as nn

PROFILE = "cpu"
SIZES = {
    "cpu": {"batch_size": 128, "in_features": 512, "out_features": 512},
    "gpu": {"batch_size": 8192, "in_features": 8192, "out_features": 8192},
}
batch_size = SIZES[PROFILE]["batch_size"]
in_features = SIZES[PROFILE]["in_features"]
out_features = SIZES[PROFILE]["out_features"]


class Model(nn.Module):
    def __init__(self, in_features, out_features):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(out_features, in_features) / math.sqrt(in_features))
        self.bias = nn.Parameter(torch.randn(out_features) * 0.1)

    def forward(self, x):
        y = torch.matmul(x, self.weight.t()) + self.bias
        y = torch.relu(y)
        return y


def get_inputs():
    return [torch.randn(batch_size, in_features)]


def get_init_inputs():
    return [in_features, out_features]
