# reference: row_sum
# expect: incorrect
# The reduction loop skips each row's last column.
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

source = r"""
#include <torch/extension.h>

__global__ void row_sum_kernel(const float* x, float* out, int cols) {
    __shared__ float buf[256];
    const float* row = x + (size_t)blockIdx.x * cols;
    float s = 0.f;
    for (int c = threadIdx.x; c < cols - 1; c += blockDim.x) s += row[c];
    buf[threadIdx.x] = s;
    __syncthreads();
    for (int k = blockDim.x / 2; k > 0; k >>= 1) {
        if (threadIdx.x < k) buf[threadIdx.x] += buf[threadIdx.x + k];
        __syncthreads();
    }
    if (threadIdx.x == 0) out[blockIdx.x] = buf[0];
}

torch::Tensor row_sum(torch::Tensor x) {
    auto out = torch::empty({x.size(0), 1}, x.options());
    row_sum_kernel<<<x.size(0), 256>>>(x.data_ptr<float>(), out.data_ptr<float>(), x.size(1));
    return out;
}
"""

ext = load_inline(
    name="row_sum_off_by_one",
    cpp_sources="torch::Tensor row_sum(torch::Tensor x);",
    cuda_sources=source,
    functions=["row_sum"],
)


class ModelNew(nn.Module):
    def forward(self, x):
        return ext.row_sum(x)
