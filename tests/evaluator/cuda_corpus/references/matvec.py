import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, a, x):
        return torch.matmul(a, x)


def get_inputs():
    return [torch.randn(1024, 2048), torch.randn(2048, 1)]


def get_init_inputs():
    return []
