# reference: sigmoid
# expect: correct
# Vectorised float4 loads and stores with a scalar tail kernel.
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cuda_source = """
#include <torch/extension.h>
#include <cuda_runtime.h>

__device__ __forceinline__ float sigmoidf(float x) {
    return 1.0f / (1.0f + expf(-x));
}

__global__ void sigmoid_vec4_kernel(const float4* __restrict__ x, float4* __restrict__ y, int n4) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n4) {
        float4 v = x[i];
        float4 r;
        r.x = sigmoidf(v.x);
        r.y = sigmoidf(v.y);
        r.z = sigmoidf(v.z);
        r.w = sigmoidf(v.w);
        y[i] = r;
    }
}

__global__ void sigmoid_tail_kernel(const float* __restrict__ x, float* __restrict__ y, int start, int n) {
    int i = start + blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = sigmoidf(x[i]);
}

torch::Tensor sigmoid_cuda(torch::Tensor x) {
    auto y = torch::empty_like(x);
    int n = x.numel();
    int n4 = n / 4;
    const int threads = 256;
    if (n4 > 0) {
        sigmoid_vec4_kernel<<<(n4 + threads - 1) / threads, threads>>>(
            reinterpret_cast<const float4*>(x.data_ptr<float>()), reinterpret_cast<float4*>(y.data_ptr<float>()), n4);
    }
    int tail = n - n4 * 4;
    if (tail > 0) {
        sigmoid_tail_kernel<<<1, threads>>>(x.data_ptr<float>(), y.data_ptr<float>(), n4 * 4, n);
    }
    return y;
}
"""

cpp_source = "torch::Tensor sigmoid_cuda(torch::Tensor x);"

sigmoid_module = load_inline(
    name="sigmoid_vec4",
    cpp_sources=cpp_source,
    cuda_sources=cuda_source,
    functions=["sigmoid_cuda"],
    extra_cuda_cflags=["-O3"],
)


class ModelNew(nn.Module):
    def forward(self, x):
        return sigmoid_module.sigmoid_cuda(x.contiguous())
