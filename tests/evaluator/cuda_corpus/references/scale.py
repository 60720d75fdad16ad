import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, s):
        super().__init__()
        self.s = s

    def forward(self, a):
        return a * self.s


def get_inputs():
    return [torch.randn(1024, 1024)]


def get_init_inputs():
    return [3.0]
