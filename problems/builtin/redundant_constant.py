"""Adds a sinusoidal position table to a (batch, seq, dim) tensor; the table is built inside forward."""

import math

import torch
import torch.nn as nn

PROFILE = "cpu"
SIZES = {
    "cpu": {"batch_size": 4, "seq_len": 256, "dim": 512},
    "gpu": {"batch_size": 16, "seq_len": 8192, "dim": 4096},
}
batch_size = SIZES[PROFILE]["batch_size"]
seq_len = SIZES[PROFILE]["seq_len"]
dim = SIZES[PROFILE]["dim"]


class Model(nn.Module):
    def __init__(self, seq_len, dim):
        super().__init__()
        self.seq_len = seq_len
        self.dim = dim

    def forward(self, x):
        positions = torch.arange(self.seq_len, dtype=x.dtype, device=x.device).unsqueeze(1)
        steps = torch.arange(0, self.dim, 2, dtype=x.dtype, device=x.device)
        inv_freq = torch.exp(steps * (-math.log(10000.0) / self.dim))
        angles = positions * inv_freq
        table = torch.cat([torch.sin(angles), torch.cos(angles)], dim=-1)
        return x + table


def get_inputs():
    return [torch.randn(batch_size, seq_len, dim)]


def get_init_inputs():
    return [seq_len, dim]
