# reference: row_max
# expect: correct
# Warp-level max with __shfl_xor_sync, then across warps in shared memory.
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

code = r"""
#include <torch/extension.h>
#include <cfloat>

__device__ float warp_reduce_max(float v) {
    #pragma unroll
    for (int mask = 16; mask > 0; mask >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, mask));
    return v;
}

__global__ void row_max_kernel(const float* __restrict__ x, float* __restrict__ out, int cols) {
    __shared__ float warp_max[32];
    const float* row = x + (size_t)blockIdx.x * cols;
    float m = -FLT_MAX;
    for (int c = threadIdx.x; c < cols; c += blockDim.x) m = fmaxf(m, row[c]);
    m = warp_reduce_max(m);
    int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    if (lane == 0) warp_max[warp] = m;
    __syncthreads();
    if (warp == 0) {
        m = lane < blockDim.x / 32 ? warp_max[lane] : -FLT_MAX;
        m = warp_reduce_max(m);
        if (lane == 0) out[blockIdx.x] = m;
    }
}

torch::Tensor row_max(torch::Tensor x) {
    auto out = torch::empty({x.size(0)}, x.options());
    row_max_kernel<<<x.size(0), 512>>>(x.data_ptr<float>(), out.data_ptr<float>(), x.size(1));
    return out;
}
"""

rowmax = load_inline(
    name="row_max", cpp_sources="torch::Tensor row_max(torch::Tensor x);", cuda_sources=code, functions=["row_max"]
)


class ModelNew(nn.Module):
    def forward(self, x):
        return rowmax.row_max(x)
