# reference: gelu
# expect: incorrect
# The tanh approximation of GELU against the exact reference: off by up to about 5e-4, past fp32 tolerance.
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

source = r"""
#include <torch/extension.h>
#include <math.h>

__global__ void gelu_tanh_kernel(const float* __restrict__ x, float* __restrict__ y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        float v = x[i];
        float inner = 0.7978845608028654f * (v + 0.044715f * v * v * v);
        y[i] = 0.5f * v * (1.0f + tanhf(inner));
    }
}

torch::Tensor gelu_tanh(torch::Tensor x) {
    auto y = torch::empty_like(x);
    int n = x.numel();
    gelu_tanh_kernel<<<(n + 255) / 256, 256>>>(x.data_ptr<float>(), y.data_ptr<float>(), n);
    return y;
}
"""

ext = load_inline(
    name="gelu_tanh",
    cpp_sources="torch::Tensor gelu_tanh(torch::Tensor x);",
    cuda_sources=source,
    functions=["gelu_tanh"],
)


class ModelNew(nn.Module):
    def forward(self, x):
        return ext.gelu_tanh(x)
