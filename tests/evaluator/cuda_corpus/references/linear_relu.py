import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, in_features=512, out_features=256):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)

    def forward(self, x):
        return torch.relu(self.linear(x))


def get_inputs():
    return [torch.randn(128, 512)]


def get_init_inputs():
    return [512, 256]
