# reference: bf16_add
# expect: correct
# __nv_bfloat16 from cuda_bf16.h; the wrapper reinterprets at::BFloat16 data.
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

source = r"""
#include <torch/extension.h>
#include <cuda_bf16.h>

__global__ void add_bf16_kernel(const __nv_bfloat16* __restrict__ a, const __nv_bfloat16* __restrict__ b,
                                __nv_bfloat16* __restrict__ c, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        float s = __bfloat162float(a[i]) + __bfloat162float(b[i]);
        c[i] = __float2bfloat16(s);
    }
}

torch::Tensor add_bf16(torch::Tensor a, torch::Tensor b) {
    TORCH_CHECK(a.scalar_type() == at::kBFloat16 && b.scalar_type() == at::kBFloat16, "bfloat16 inputs");
    auto c = torch::empty_like(a);
    int n = a.numel();
    int threads = 256;
    add_bf16_kernel<<<(n + threads - 1) / threads, threads>>>(
        reinterpret_cast<const __nv_bfloat16*>(a.data_ptr<at::BFloat16>()),
        reinterpret_cast<const __nv_bfloat16*>(b.data_ptr<at::BFloat16>()),
        reinterpret_cast<__nv_bfloat16*>(c.data_ptr<at::BFloat16>()), n);
    return c;
}
"""

add_module = load_inline(
    name="add_bf16",
    cpp_sources="torch::Tensor add_bf16(torch::Tensor a, torch::Tensor b);",
    cuda_sources=source,
    functions=["add_bf16"],
)


class ModelNew(nn.Module):
    def forward(self, a, b):
        return add_module.add_bf16(a, b)
