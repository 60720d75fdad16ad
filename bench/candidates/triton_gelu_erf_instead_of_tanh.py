"""Computes the erf GELU where the problem asks for the tanh approximation (wrong by up to ~1e-3)."""

import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def gelu_erf_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask)
    y = 0.5 * x * (1.0 + tl.erf(x * 0.7071067811865476))
    tl.store(y_ptr + offs, y, mask=mask)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        x = x.contiguous()
        y = torch.empty_like(x)
        n = x.numel()
        gelu_erf_kernel[(triton.cdiv(n, 4096),)](x, y, n, BLOCK=4096)
        return y
