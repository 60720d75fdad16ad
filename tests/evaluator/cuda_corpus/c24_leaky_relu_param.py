# reference: leaky_relu
# expect: correct
# A float parameter from Python through the binding (double), checked in the wrapper.
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

leaky_src = r"""
#include <torch/extension.h>

__global__ void leaky_relu_kernel(const float* x, float* y, float slope, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        float v = x[i];
        y[i] = v >= 0.f ? v : v * slope;
    }
}

at::Tensor leaky_relu(const at::Tensor& x, double negative_slope) {
    TORCH_CHECK(x.is_contiguous());
    at::Tensor y = at::empty_like(x);
    const int n = static_cast<int>(x.numel());
    leaky_relu_kernel<<<(n + 1023) / 1024, 1024>>>(x.data_ptr<float>(), y.data_ptr<float>(),
                                                    static_cast<float>(negative_slope), n);
    return y;
}
"""

leaky = load_inline(
    name="leaky_relu",
    cpp_sources="at::Tensor leaky_relu(const at::Tensor& x, double negative_slope);",
    cuda_sources=leaky_src,
    functions=["leaky_relu"],
)


class ModelNew(nn.Module):
    def __init__(self, negative_slope: float = 0.01):
        super().__init__()
        self.negative_slope = negative_slope

    def forward(self, x):
        return leaky.leaky_relu(x, self.negative_slope)
