"""A CUDA kernel with a syntax error."""

import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cuda_source = r"""
#include <torch/extension.h>
__global__ void swish_broken_kernel(const float* x, float* y, int64_t n) {
    int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x
    if (i < n) y[i] = x[i] / (1.f + __expf(-x[i]));
}
torch::Tensor swish_broken(torch::Tensor x) {
    auto y = torch::empty_like(x);
    swish_broken_kernel<<<(x.numel() + 255) / 256, 256>>>(x.data_ptr<float>(), y.data_ptr<float>(), x.numel());
    return y;
}
"""
ext = load_inline(
    name="swish_broken_ext",
    cpp_sources="torch::Tensor swish_broken(torch::Tensor x);",
    cuda_sources=cuda_source,
    functions=["swish_broken"],
)


class ModelNew(nn.Module):
    def forward(self, x):
        return ext.swish_broken(x)
