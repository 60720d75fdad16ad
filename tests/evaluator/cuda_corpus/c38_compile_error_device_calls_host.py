# reference: sigmoid
# expect: compile_error
# A kernel that calls a host function.
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

source = r"""
#include <torch/extension.h>

float logistic(float v) { return 1.0f / (1.0f + expf(-v)); }

__global__ void sigmoid_kernel(const float* x, float* y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = logistic(x[i]);
}

torch::Tensor sigmoid(torch::Tensor x) {
    auto y = torch::empty_like(x);
    int n = x.numel();
    sigmoid_kernel<<<(n + 255) / 256, 256>>>(x.data_ptr<float>(), y.data_ptr<float>(), n);
    return y;
}
"""

ext = load_inline(
    name="sigmoid_hostcall",
    cpp_sources="torch::Tensor sigmoid(torch::Tensor x);",
    cuda_sources=source,
    functions=["sigmoid"],
)


class ModelNew(nn.Module):
    def forward(self, x):
        return ext.sigmoid(x)
