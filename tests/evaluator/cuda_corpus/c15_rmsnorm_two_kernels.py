# reference: rmsnorm
# expect: correct
# Two kernels: per-row inverse RMS into a buffer, then an elementwise scale; ATen allocates the buffer.
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

rms_source = r"""
#include <torch/extension.h>

__global__ void row_inv_rms_kernel(const float* __restrict__ x, float* __restrict__ inv_rms, int cols, float eps) {
    __shared__ float partial[256];
    int row = blockIdx.x;
    float acc = 0.f;
    for (int c = threadIdx.x; c < cols; c += blockDim.x) {
        float v = x[(size_t)row * cols + c];
        acc += v * v;
    }
    partial[threadIdx.x] = acc;
    __syncthreads();
    for (int s = blockDim.x / 2; s > 0; s >>= 1) {
        if (threadIdx.x < s) partial[threadIdx.x] += partial[threadIdx.x + s];
        __syncthreads();
    }
    if (threadIdx.x == 0) inv_rms[row] = 1.0f / sqrtf(partial[0] / cols + eps);
}

__global__ void scale_rows_kernel(const float* __restrict__ x, const float* __restrict__ inv_rms,
                                  float* __restrict__ y, int rows, int cols) {
    int idx = blockIdx.x * blockDim.x + threadIdx.x;
    if (idx < rows * cols) y[idx] = x[idx] * inv_rms[idx / cols];
}

torch::Tensor rmsnorm(torch::Tensor x, float eps) {
    int rows = x.size(0), cols = x.size(1);
    auto inv = torch::empty({rows}, x.options());
    auto y = torch::empty_like(x);
    row_inv_rms_kernel<<<rows, 256>>>(x.data_ptr<float>(), inv.data_ptr<float>(), cols, eps);
    int total = rows * cols;
    scale_rows_kernel<<<(total + 255) / 256, 256>>>(x.data_ptr<float>(), inv.data_ptr<float>(), y.data_ptr<float>(), rows, cols);
    return y;
}
"""

rms_cpp = "torch::Tensor rmsnorm(torch::Tensor x, float eps);"

rms = load_inline(name="rmsnorm2k", cpp_sources=rms_cpp, cuda_sources=rms_source, functions=["rmsnorm"])


class ModelNew(nn.Module):
    def __init__(self, eps=1e-5):
        super().__init__()
        self.eps = eps

    def forward(self, x):
        return rms.rmsnorm(x, self.eps)
