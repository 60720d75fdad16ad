# reference: scale
# expect: correct
# AT_DISPATCH_FLOATING_TYPES with c10's stream, a scalar argument cast to scalar_t, TORCH_CHECK on the launch.
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

source = r"""
#include <torch/extension.h>
#include <c10/cuda/CUDAStream.h>

template <typename scalar_t>
__global__ void scale_kernel(const scalar_t* __restrict__ a, scalar_t* __restrict__ out, scalar_t s, int64_t n) {
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = a[i] * s;
}

torch::Tensor scale(const torch::Tensor& a, double s) {
    auto out = at::empty_like(a);
    const int64_t n = a.numel();
    const int threads = 256;
    const dim3 grid((n + threads - 1) / threads);
    auto stream = c10::cuda::getCurrentCUDAStream();
    AT_DISPATCH_FLOATING_TYPES(a.scalar_type(), "scale", [&] {
        scale_kernel<scalar_t><<<grid, threads, 0, stream.stream()>>>(
            a.data_ptr<scalar_t>(), out.data_ptr<scalar_t>(), static_cast<scalar_t>(s), n);
    });
    TORCH_CHECK(cudaGetLastError() == cudaSuccess, "scale_kernel failed");
    return out;
}
"""

ext = load_inline(
    name="scale_dispatch",
    cpp_sources="torch::Tensor scale(const torch::Tensor& a, double s);",
    cuda_sources=source,
    functions=["scale"],
)


class ModelNew(nn.Module):
    def __init__(self, s):
        super().__init__()
        self.s = s

    def forward(self, a):
        return ext.scale(a, self.s)
