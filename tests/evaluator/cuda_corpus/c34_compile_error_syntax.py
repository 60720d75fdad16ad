# reference: relu
# expect: compile_error
# A missing semicolon in the kernel.
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

source = r"""
#include <torch/extension.h>

__global__ void relu_kernel(const float* x, float* y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x
    if (i < n) y[i] = fmaxf(x[i], 0.f);
}

torch::Tensor relu(torch::Tensor x) {
    auto y = torch::empty_like(x);
    int n = x.numel();
    relu_kernel<<<(n + 255) / 256, 256>>>(x.data_ptr<float>(), y.data_ptr<float>(), n);
    return y;
}
"""

ext = load_inline(
    name="relu_syntax", cpp_sources="torch::Tensor relu(torch::Tensor x);", cuda_sources=source, functions=["relu"]
)


class ModelNew(nn.Module):
    def forward(self, x):
        return ext.relu(x)
