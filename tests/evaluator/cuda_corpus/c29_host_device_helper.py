# reference: gelu
# expect: correct
# An inline __host__ __device__ helper used on both sides, and __device__ helpers.
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

source = r"""
#include <torch/extension.h>

__host__ __device__ inline int ceil_div(int a, int b) { return (a + b - 1) / b; }

__device__ __forceinline__ float gelu_exact(float x) {
    return 0.5f * x * (1.0f + erff(x * 0.7071067811865475f));
}

__global__ void gelu_kernel(const float* __restrict__ x, float* __restrict__ y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = gelu_exact(x[i]);
}

torch::Tensor gelu(torch::Tensor x) {
    auto y = torch::empty_like(x);
    int n = x.numel();
    gelu_kernel<<<ceil_div(n, 256), 256>>>(x.data_ptr<float>(), y.data_ptr<float>(), n);
    return y;
}
"""

ext = load_inline(
    name="gelu_helpers", cpp_sources="torch::Tensor gelu(torch::Tensor x);", cuda_sources=source, functions=["gelu"]
)


class ModelNew(nn.Module):
    def forward(self, x):
        return ext.gelu(x)
