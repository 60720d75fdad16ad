"""Multi-head self-attention block: q/k/v projections, scaled dot-product softmax attention, output projection."""

import math

import torch
import torch.nn as nn

PROFILE = "cpu"
SIZES = {
    "cpu": {"batch_size": 4, "seq_len": 128, "embed_dim": 128, "num_heads": 4},
    "gpu": {"batch_size": 16, "seq_len": 2048, "embed_dim": 1024, "num_heads": 16},
}
batch_size = SIZES[PROFILE]["batch_size"]
seq_len = SIZES[PROFILE]["seq_len"]
embed_dim = SIZES[PROFILE]["embed_dim"]
num_heads = SIZES[PROFILE]["num_heads"]


class Model(nn.Module):
    def __init__(self, embed_dim, num_heads):
        super().__init__()
        self.embed_dim = embed_dim
        self.num_heads = num_heads
        self.head_dim = embed_dim // num_heads
        self.q_proj = nn.Linear(embed_dim, embed_dim)
        self.k_proj = nn.Linear(embed_dim, embed_dim)
        self.v_proj = nn.Linear(embed_dim, embed_dim)
        self.out_proj = nn.Linear(embed_dim, embed_dim)

    def forward(self, x):
        batch, seq, _ = x.shape
        q = self.q_proj(x)
        k = self.k_proj(x)
        v = self.v_proj(x)
        q = q.view(batch, seq, self.num_heads, self.head_dim).transpose(1, 2)
        k = k.view(batch, seq, self.num_heads, self.head_dim).transpose(1, 2)
        v = v.view(batch, seq, self.num_heads, self.head_dim).transpose(1, 2)
        scores = torch.matmul(q, k.transpose(-2, -1)) / math.sqrt(self.head_dim)
        p = torch.softmax(scores, dim=-1)
        out = torch.matmul(p, v)
        out = out.transpose(1, 2).contiguous().view(batch, seq, self.embed_dim)
        return self.out_proj(out)


def get_inputs():
    return [torch.randn(batch_size, seq_len, embed_dim)]


def get_init_inputs():
    return [embed_dim, num_heads]
