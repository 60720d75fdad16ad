# reference: layernorm
# expect: correct
# Block reduction of mean and variance: warp shuffles, then one value per warp in static shared memory.
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

layernorm_cuda = r"""
#include <torch/extension.h>
#include <cuda_runtime.h>

__inline__ __device__ float warpReduceSum(float val) {
    for (int offset = 16; offset > 0; offset >>= 1)
        val += __shfl_down_sync(0xffffffff, val, offset);
    return val;
}

__inline__ __device__ float blockReduceSum(float val) {
    static __shared__ float shared[32];
    int lane = threadIdx.x & 31;
    int wid = threadIdx.x >> 5;
    val = warpReduceSum(val);
    if (lane == 0) shared[wid] = val;
    __syncthreads();
    val = (threadIdx.x < (blockDim.x + 31) / 32) ? shared[lane] : 0.0f;
    if (wid == 0) val = warpReduceSum(val);
    __syncthreads();
    return val;
}

__global__ void layernorm_kernel(const float* __restrict__ x, float* __restrict__ y, int D, float eps) {
    int row = blockIdx.x;
    const float* xr = x + (size_t)row * D;
    float* yr = y + (size_t)row * D;
    __shared__ float s_mean, s_rstd;
    float sum = 0.f;
    for (int i = threadIdx.x; i < D; i += blockDim.x) sum += xr[i];
    sum = blockReduceSum(sum);
    if (threadIdx.x == 0) s_mean = sum / D;
    __syncthreads();
    float mean = s_mean;
    float var = 0.f;
    for (int i = threadIdx.x; i < D; i += blockDim.x) {
        float d = xr[i] - mean;
        var += d * d;
    }
    var = blockReduceSum(var);
    if (threadIdx.x == 0) s_rstd = rsqrtf(var / D + eps);
    __syncthreads();
    float rstd = s_rstd;
    for (int i = threadIdx.x; i < D; i += blockDim.x) yr[i] = (xr[i] - mean) * rstd;
}

torch::Tensor layernorm_forward(torch::Tensor x, double eps) {
    auto y = torch::empty_like(x);
    int D = x.size(-1);
    int rows = x.numel() / D;
    layernorm_kernel<<<rows, 256>>>(x.data_ptr<float>(), y.data_ptr<float>(), D, (float)eps);
    return y;
}
"""

ln = load_inline(
    name="layernorm_block",
    cpp_sources="torch::Tensor layernorm_forward(torch::Tensor x, double eps);",
    cuda_sources=layernorm_cuda,
    functions=["layernorm_forward"],
)


class ModelNew(nn.Module):
    def forward(self, x):
        return ln.layernorm_forward(x.contiguous(), 1e-5)
