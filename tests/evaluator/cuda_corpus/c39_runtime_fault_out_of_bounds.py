# reference: relu
# expect: runtime_error
# A wrong stride indexes far past the end of the output: an illegal address on the device.
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

source = r"""
#include <torch/extension.h>

__global__ void relu_rows_kernel(const float* x, float* y, int rows, int cols) {
    int r = blockIdx.x;
    for (int c = threadIdx.x; c < cols; c += blockDim.x) {
        float v = x[(size_t)r * cols + c];
        y[(size_t)c * rows * cols * 1024 + r] = v > 0.f ? v : 0.f;
    }
}

torch::Tensor relu_rows(torch::Tensor x) {
    auto y = torch::empty_like(x);
    relu_rows_kernel<<<x.size(0), 256>>>(x.data_ptr<float>(), y.data_ptr<float>(), x.size(0), x.size(1));
    cudaDeviceSynchronize();
    cudaError_t err = cudaGetLastError();
    TORCH_CHECK(err == cudaSuccess, "CUDA error: ", cudaGetErrorString(err));
    return y;
}
"""

ext = load_inline(
    name="relu_oob",
    cpp_sources="torch::Tensor relu_rows(torch::Tensor x);",
    cuda_sources=source,
    functions=["relu_rows"],
)


class ModelNew(nn.Module):
    def forward(self, x):
        return ext.relu_rows(x)
