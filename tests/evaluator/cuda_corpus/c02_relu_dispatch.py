# reference: relu
# expect: correct
# A templated kernel launched with scalar_t inside AT_DISPATCH_FLOATING_TYPES, grid-stride loop.
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cuda_src = r"""
#include <torch/extension.h>

template <typename scalar_t>
__global__ void relu_forward_kernel(const scalar_t* __restrict__ x, scalar_t* __restrict__ y, int64_t n) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)blockDim.x * gridDim.x) {
        scalar_t v = x[i];
        y[i] = v > scalar_t(0) ? v : scalar_t(0);
    }
}

torch::Tensor relu_forward(torch::Tensor x) {
    TORCH_CHECK(x.is_cuda(), "x must be on CUDA");
    auto y = torch::empty_like(x);
    const int64_t n = x.numel();
    const int threads = 512;
    const int blocks = std::min<int64_t>((n + threads - 1) / threads, 4096);
    AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "relu_forward", ([&] {
        relu_forward_kernel<scalar_t><<<blocks, threads>>>(x.data_ptr<scalar_t>(), y.data_ptr<scalar_t>(), n);
    }));
    return y;
}
"""

cpp_src = "torch::Tensor relu_forward(torch::Tensor x);"

module = load_inline(name="relu_dispatch", cpp_sources=cpp_src, cuda_sources=cuda_src, functions=["relu_forward"])


class ModelNew(nn.Module):
    def forward(self, x):
        return module.relu_forward(x.contiguous())
