"""Small-batch dense layer with tanh; the weight is transposed, copied and scaled inside forward."""

import math

import torch
import torch.nn as nn

PROFILE = "cpu"
SIZES = {
    "cpu": {"batch_size": 16, "in_features": 768, "out_features": 768},
    "gpu": {"batch_size": 256, "in_features": 8192, "out_features": 8192},
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
        w_t = self.weight.t().contiguous()
        w_scaled = w_t * 0.5
        b = self.bias.unsqueeze(0).expand(x.shape[0], -1).contiguous()
        y = torch.matmul(x, w_scaled) + b
        y = torch.tanh(y)
        return y


def get_inputs():
    return [torch.randn(batch_size, in_features)]


def get_init_inputs():
    return [in_features, out_features]
