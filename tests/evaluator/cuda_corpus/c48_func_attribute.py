# reference: softmax
# expect: correct
# The host names the kernel outside a launch (cudaFuncSetAttribute for dynamic shared memory).
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

source = r"""
#include <torch/extension.h>

__global__ void softmax_row_kernel(const float* __restrict__ x, float* __restrict__ y, int cols) {
    extern __shared__ float row[];
    const float* xr = x + (size_t)blockIdx.x * cols;
    float* yr = y + (size_t)blockIdx.x * cols;
    for (int c = threadIdx.x; c < cols; c += blockDim.x) row[c] = xr[c];
    __syncthreads();
    __shared__ float s_max, s_sum;
    if (threadIdx.x == 0) {
        float m = row[0];
        for (int c = 1; c < cols; ++c) m = fmaxf(m, row[c]);
        float s = 0.f;
        for (int c = 0; c < cols; ++c) s += expf(row[c] - m);
        s_max = m;
        s_sum = s;
    }
    __syncthreads();
    for (int c = threadIdx.x; c < cols; c += blockDim.x) yr[c] = expf(row[c] - s_max) / s_sum;
}

torch::Tensor softmax_rows(torch::Tensor x) {
    auto y = torch::empty_like(x);
    int rows = x.size(0), cols = x.size(1);
    size_t shared = cols * sizeof(float);
    cudaFuncSetAttribute(softmax_row_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)shared);
    softmax_row_kernel<<<rows, 256, shared>>>(x.data_ptr<float>(), y.data_ptr<float>(), cols);
    return y;
}
"""

ext = load_inline(
    name="softmax_attr",
    cpp_sources="torch::Tensor softmax_rows(torch::Tensor x);",
    cuda_sources=source,
    functions=["softmax_rows"],
)


class ModelNew(nn.Module):
    def forward(self, x):
        return ext.softmax_rows(x)
