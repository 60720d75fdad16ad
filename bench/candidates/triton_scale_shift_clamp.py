"""Scale, shift, clamp, tanh, abs and double fused into one Triton kernel."""

import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def ssc_kernel(x_ptr, y_ptr, n, scale, shift, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask)
    c = tl.minimum(tl.maximum(x * scale + shift, -1.0), 1.0)
    y = 2.0 * tl.abs(2.0 * tl.sigmoid(2.0 * c) - 1.0)
    tl.store(y_ptr + offs, y, mask=mask)


class ModelNew(nn.Module):
    def __init__(self, scale, shift):
        super().__init__()
        self.scale = scale
        self.shift = shift

    def forward(self, x):
        x = x.contiguous()
        y = torch.empty_like(x)
        n = x.numel()
        ssc_kernel[(triton.cdiv(n, 4096),)](x, y, n, self.scale, self.shift, BLOCK=4096)
        return y
