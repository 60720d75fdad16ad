# reference: add
# expect: correct
# A block size behind #ifndef: a preprocessor conditional the splitter does not see through.
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

source = r"""
#include <torch/extension.h>

#ifndef BLOCK_SIZE
#define BLOCK_SIZE 256
#endif

__global__ void add_kernel(const float* a, const float* b, float* c, int n) {
    int i = blockIdx.x * BLOCK_SIZE + threadIdx.x;
    if (i < n) c[i] = a[i] + b[i];
}

torch::Tensor add(torch::Tensor a, torch::Tensor b) {
    auto c = torch::empty_like(a);
    int n = a.numel();
    add_kernel<<<(n + BLOCK_SIZE - 1) / BLOCK_SIZE, BLOCK_SIZE>>>(a.data_ptr<float>(), b.data_ptr<float>(),
                                                                 c.data_ptr<float>(), n);
    return c;
}
"""

ext = load_inline(
    name="add_guarded",
    cpp_sources="torch::Tensor add(torch::Tensor a, torch::Tensor b);",
    cuda_sources=source,
    functions=["add"],
)


class ModelNew(nn.Module):
    def forward(self, a, b):
        return ext.add(a, b)
