# reference: half_relu
# expect: correct
# AT_DISPATCH_FLOATING_TYPES_AND2(kHalf, kBFloat16) with an opmath type chosen in the kernel.
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

source = r"""
#include <torch/extension.h>

template <typename scalar_t>
__global__ void relu_any_kernel(const scalar_t* __restrict__ x, scalar_t* __restrict__ y, int64_t n) {
    int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (i < n) {
        float v = static_cast<float>(x[i]);
        y[i] = static_cast<scalar_t>(fmaxf(v, 0.0f));
    }
}

torch::Tensor relu_any(torch::Tensor x) {
    auto y = torch::empty_like(x);
    int64_t n = x.numel();
    const int threads = 256;
    const int64_t blocks = (n + threads - 1) / threads;
    AT_DISPATCH_FLOATING_TYPES_AND2(at::ScalarType::Half, at::ScalarType::BFloat16, x.scalar_type(), "relu_any", [&] {
        relu_any_kernel<scalar_t><<<blocks, threads>>>(x.data_ptr<scalar_t>(), y.data_ptr<scalar_t>(), n);
    });
    return y;
}
"""

ext = load_inline(
    name="relu_any", cpp_sources="torch::Tensor relu_any(torch::Tensor x);", cuda_sources=source, functions=["relu_any"]
)


class ModelNew(nn.Module):
    def forward(self, x):
        return ext.relu_any(x)
