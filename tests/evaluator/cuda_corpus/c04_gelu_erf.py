# reference: gelu
# expect: correct
# Exact GELU with erff, a constant at namespace scope, a grid-stride loop.
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

gelu_cuda = r"""
#include <torch/extension.h>
#include <cuda.h>
#include <cuda_runtime.h>
#include <math.h>

constexpr float kInvSqrt2 = 0.70710678118654752440f;

__global__ void gelu_kernel(const float* x, float* out, int n) {
    int stride = blockDim.x * gridDim.x;
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        float v = x[i];
        out[i] = 0.5f * v * (1.0f + erff(v * kInvSqrt2));
    }
}

torch::Tensor gelu_forward(torch::Tensor x) {
    auto out = torch::empty_like(x);
    int n = x.numel();
    int block = 256;
    int grid = (n + block - 1) / block;
    if (grid > 65535) grid = 65535;
    gelu_kernel<<<grid, block>>>(x.data_ptr<float>(), out.data_ptr<float>(), n);
    cudaError_t err = cudaGetLastError();
    TORCH_CHECK(err == cudaSuccess, "gelu_kernel launch failed: ", cudaGetErrorString(err));
    return out;
}
"""

gelu_cpp = "torch::Tensor gelu_forward(torch::Tensor x);"

gelu = load_inline(name="gelu", cpp_sources=gelu_cpp, cuda_sources=gelu_cuda, functions=["gelu_forward"], verbose=False)


class ModelNew(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.gelu = gelu

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.gelu.gelu_forward(x)
