# reference: softmax
# expect: correct
# One block per row; max and sum reduced in dynamic shared memory.
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

softmax_source = r"""
#include <torch/extension.h>
#include <cuda_runtime.h>
#include <float.h>

__global__ void softmax_kernel(const float* __restrict__ input, float* __restrict__ output, int rows, int cols) {
    extern __shared__ float sdata[];
    int row = blockIdx.x;
    int tid = threadIdx.x;
    const float* in_row = input + (size_t)row * cols;
    float* out_row = output + (size_t)row * cols;

    float local_max = -FLT_MAX;
    for (int c = tid; c < cols; c += blockDim.x) local_max = fmaxf(local_max, in_row[c]);
    sdata[tid] = local_max;
    __syncthreads();
    for (int s = blockDim.x / 2; s > 0; s >>= 1) {
        if (tid < s) sdata[tid] = fmaxf(sdata[tid], sdata[tid + s]);
        __syncthreads();
    }
    float row_max = sdata[0];
    __syncthreads();

    float local_sum = 0.0f;
    for (int c = tid; c < cols; c += blockDim.x) {
        float e = expf(in_row[c] - row_max);
        out_row[c] = e;
        local_sum += e;
    }
    sdata[tid] = local_sum;
    __syncthreads();
    for (int s = blockDim.x / 2; s > 0; s >>= 1) {
        if (tid < s) sdata[tid] += sdata[tid + s];
        __syncthreads();
    }
    float inv = 1.0f / sdata[0];
    for (int c = tid; c < cols; c += blockDim.x) out_row[c] *= inv;
}

torch::Tensor softmax_cuda(torch::Tensor input) {
    auto output = torch::empty_like(input);
    int rows = input.size(0);
    int cols = input.size(1);
    int threads = 256;
    size_t shared = threads * sizeof(float);
    softmax_kernel<<<rows, threads, shared>>>(input.data_ptr<float>(), output.data_ptr<float>(), rows, cols);
    return output;
}
"""

softmax_cpp_source = "torch::Tensor softmax_cuda(torch::Tensor input);"

softmax_module = load_inline(
    name="softmax_shared",
    cpp_sources=softmax_cpp_source,
    cuda_sources=softmax_source,
    functions=["softmax_cuda"],
    verbose=False,
)


class ModelNew(nn.Module):
    def __init__(self):
        super(ModelNew, self).__init__()
        self.softmax = softmax_module

    def forward(self, x):
        return self.softmax.softmax_cuda(x.contiguous())
