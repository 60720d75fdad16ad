"""RMSNorm in Triton, one program per row."""

import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def rmsnorm_kernel(x_ptr, w_ptr, y_ptr, n_cols, eps, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    mask = offs < n_cols
    x = tl.load(x_ptr + row * n_cols + offs, mask=mask, other=0.0)
    r = tl.rsqrt(tl.sum(x * x, 0) / n_cols + eps)
    w = tl.load(w_ptr + offs, mask=mask, other=0.0)
    tl.store(y_ptr + row * n_cols + offs, x * r * w, mask=mask)


class ModelNew(nn.Module):
    def __init__(self, hidden, eps):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(hidden))

    def forward(self, x):
        x = x.contiguous()
        y = torch.empty_like(x)
        rmsnorm_kernel[(x.shape[0],)](
            x, self.weight, y, x.shape[1], self.eps, BLOCK=triton.next_power_of_2(x.shape[1]), num_warps=16
        )
        return y
