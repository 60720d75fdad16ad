# reference: add
# expect: compile_error
# The wrapper uses a variable it never declared.
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

source = r"""
#include <torch/extension.h>

__global__ void add_kernel(const float* a, const float* b, float* c, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) c[i] = a[i] + b[i];
}

torch::Tensor add(torch::Tensor a, torch::Tensor b) {
    auto c = torch::empty_like(a);
    int n = a.numel();
    add_kernel<<<num_blocks, 256>>>(a.data_ptr<float>(), b.data_ptr<float>(), c.data_ptr<float>(), n);
    return c;
}
"""

ext = load_inline(
    name="add_undeclared",
    cpp_sources="torch::Tensor add(torch::Tensor a, torch::Tensor b);",
    cuda_sources=source,
    functions=["add"],
)


class ModelNew(nn.Module):
    def forward(self, a, b):
        return ext.add(a, b)
