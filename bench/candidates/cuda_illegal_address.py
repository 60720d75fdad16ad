"""Swish that writes far past the end of its output: an illegal memory access."""

import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cuda_source = r"""
#include <torch/extension.h>

__global__ void swish_oob_kernel(const float* __restrict__ x, float* __restrict__ y, int64_t n) {
    int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += stride) {
        float v = x[i];
        y[i] = v / (1.f + __expf(-v)); y[i + n * 64] = v;
    }
}

torch::Tensor swish_oob_forward(torch::Tensor x) {
    TORCH_CHECK(x.is_cuda() && x.scalar_type() == torch::kFloat32, "expects a float32 CUDA tensor");
    x = x.contiguous();
    auto y = torch::empty_like(x);
    int64_t n = x.numel();
    int64_t blocks = (n + 255) / 256;
    if (blocks > 132 * 64) blocks = 132 * 64;
    swish_oob_kernel<<<(int)blocks, 256>>>(x.data_ptr<float>(), y.data_ptr<float>(), n);
    return y;
}
"""

cpp_source = "torch::Tensor swish_oob_forward(torch::Tensor x);"

ext = load_inline(
    name="swish_oob_ext",
    cpp_sources=cpp_source,
    cuda_sources=cuda_source,
    functions=["swish_oob_forward"],
    extra_cuda_cflags=["-O3"],
)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        return ext.swish_oob_forward(x)
