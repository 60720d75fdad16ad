# reference: relu
# expect: correct
# The torch wrapper in cpp_sources calls a plain launcher function defined in the .cu.
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cuda_source = r"""
#include <cuda_runtime.h>

__global__ void relu_kernel(const float* __restrict__ x, float* __restrict__ y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = x[i] > 0.0f ? x[i] : 0.0f;
}

void launch_relu(const float* x, float* y, int n) {
    relu_kernel<<<(n + 255) / 256, 256>>>(x, y, n);
}
"""

cpp_source = r"""
#include <torch/extension.h>

void launch_relu(const float* x, float* y, int n);

torch::Tensor relu(torch::Tensor x) {
    TORCH_CHECK(x.is_cuda() && x.is_contiguous(), "contiguous CUDA tensor expected");
    auto y = torch::empty_like(x);
    launch_relu(x.data_ptr<float>(), y.data_ptr<float>(), x.numel());
    return y;
}
"""

ext = load_inline(name="relu_cpp_wrapper", cpp_sources=cpp_source, cuda_sources=cuda_source, functions=["relu"])


class ModelNew(nn.Module):
    def forward(self, x):
        return ext.relu(x)
