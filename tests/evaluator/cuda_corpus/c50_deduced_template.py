# reference: scale
# expect: correct
# A templated kernel launched without template arguments (deduced from the pointers).
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

source = r"""
#include <torch/extension.h>

template <typename T>
__global__ void scale_kernel(const T* __restrict__ a, T* __restrict__ out, T s, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = a[i] * s;
}

torch::Tensor scale(torch::Tensor a, double s) {
    auto out = torch::empty_like(a);
    int n = a.numel();
    scale_kernel<<<(n + 255) / 256, 256>>>(a.data_ptr<float>(), out.data_ptr<float>(), (float)s, n);
    return out;
}
"""

ext = load_inline(
    name="scale_deduced",
    cpp_sources="torch::Tensor scale(torch::Tensor a, double s);",
    cuda_sources=source,
    functions=["scale"],
)


class ModelNew(nn.Module):
    def __init__(self, s):
        super().__init__()
        self.s = s

    def forward(self, a):
        return ext.scale(a, self.s)
