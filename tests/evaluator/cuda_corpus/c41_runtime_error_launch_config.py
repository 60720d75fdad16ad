# reference: relu
# expect: runtime_error
# 2048 threads per block: the launch fails and the wrapper's error check raises.
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

source = r"""
#include <torch/extension.h>
#include <c10/cuda/CUDAException.h>

__global__ void relu_kernel(const float* x, float* y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = fmaxf(x[i], 0.f);
}

torch::Tensor relu(torch::Tensor x) {
    auto y = torch::empty_like(x);
    int n = x.numel();
    const int threads = 2048;
    relu_kernel<<<(n + threads - 1) / threads, threads>>>(x.data_ptr<float>(), y.data_ptr<float>(), n);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return y;
}
"""

ext = load_inline(
    name="relu_badlaunch", cpp_sources="torch::Tensor relu(torch::Tensor x);", cuda_sources=source, functions=["relu"]
)


class ModelNew(nn.Module):
    def forward(self, x):
        return ext.relu(x)
