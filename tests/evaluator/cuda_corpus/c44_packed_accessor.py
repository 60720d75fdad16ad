# reference: relu
# expect: correct
# Kernel parameters are torch PackedTensorAccessor32 objects: device code that needs torch's headers.
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

source = r"""
#include <torch/extension.h>

template <typename scalar_t>
__global__ void relu_2d_kernel(const torch::PackedTensorAccessor32<scalar_t, 2, torch::RestrictPtrTraits> x,
                               torch::PackedTensorAccessor32<scalar_t, 2, torch::RestrictPtrTraits> y) {
    const int r = blockIdx.y;
    const int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c < x.size(1)) {
        scalar_t v = x[r][c];
        y[r][c] = v > 0 ? v : 0;
    }
}

torch::Tensor relu_2d(torch::Tensor x) {
    auto y = torch::empty_like(x);
    const dim3 blocks((x.size(1) + 255) / 256, x.size(0));
    AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "relu_2d", ([&] {
        relu_2d_kernel<scalar_t><<<blocks, 256>>>(
            x.packed_accessor32<scalar_t, 2, torch::RestrictPtrTraits>(),
            y.packed_accessor32<scalar_t, 2, torch::RestrictPtrTraits>());
    }));
    return y;
}
"""

ext = load_inline(
    name="relu_accessor",
    cpp_sources="torch::Tensor relu_2d(torch::Tensor x);",
    cuda_sources=source,
    functions=["relu_2d"],
)


class ModelNew(nn.Module):
    def forward(self, x):
        return ext.relu_2d(x)
