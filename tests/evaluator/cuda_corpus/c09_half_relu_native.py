# reference: half_relu
# expect: correct
# cuda_fp16 intrinsics on __half, half2 vector loads.
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cuda_source = r"""
#include <torch/extension.h>
#include <cuda_fp16.h>

__global__ void relu_half2_kernel(const __half2* __restrict__ x, __half2* __restrict__ y, int n2) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n2) {
        const __half2 zero = __float2half2_rn(0.0f);
        y[i] = __hmax2(x[i], zero);
    }
}

__global__ void relu_half_kernel(const __half* __restrict__ x, __half* __restrict__ y, int start, int n) {
    int i = start + blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        y[i] = __hgt(x[i], __float2half(0.0f)) ? x[i] : __float2half(0.0f);
    }
}

torch::Tensor relu_fp16(torch::Tensor x) {
    auto y = torch::empty_like(x);
    int n = x.numel();
    int n2 = n / 2;
    const int threads = 256;
    auto xp = reinterpret_cast<const __half*>(x.data_ptr<at::Half>());
    auto yp = reinterpret_cast<__half*>(y.data_ptr<at::Half>());
    if (n2 > 0) {
        relu_half2_kernel<<<(n2 + threads - 1) / threads, threads>>>(
            reinterpret_cast<const __half2*>(xp), reinterpret_cast<__half2*>(yp), n2);
    }
    if (n % 2) {
        relu_half_kernel<<<1, 32>>>(xp, yp, n2 * 2, n);
    }
    return y;
}
"""

relu16 = load_inline(
    name="relu_fp16",
    cpp_sources="torch::Tensor relu_fp16(torch::Tensor x);",
    cuda_sources=cuda_source,
    functions=["relu_fp16"],
    extra_cuda_cflags=["-O3", "--use_fast_math"],
)


class ModelNew(nn.Module):
    def forward(self, x):
        return relu16.relu_fp16(x)
