"""Causal softmax over (batch, seq, seq) attention scores; the lower-triangular mask is built inside forward."""

import torch
import torch.nn as nn

PROFILE = "cpu"
SIZES = {
    "cpu": {"batch_size": 8, "seq_len": 256},
    "gpu": {"batch_size": 32, "seq_len": 4096},
}
batch_size = SIZES[PROFILE]["batch_size"]
seq_len = SIZES[PROFILE]["seq_len"]


class Model(nn.Module):
    def __init__(self, seq_len):
        super().__init__()
        self.seq_len = seq_len

    def forward(self, scores):
        mask = torch.tril(torch.ones(self.seq_len, self.seq_len, device=scores.device))
        masked = scores.masked_fill(mask == 0, float("-inf"))
        return torch.softmax(masked, dim=-1)


def get_inputs():
    return [torch.randn(batch_size, seq_len, seq_len)]


def get_init_inputs():
    return [seq_len]
