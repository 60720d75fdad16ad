# reference: sigmoid
# expect: correct
# functions= as a dict with docstrings; `using namespace torch` in both sources.
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cuda = r"""
#include <torch/extension.h>
using namespace torch;

__global__ void sigmoid_kernel(const float* __restrict__ x, float* __restrict__ y, size_t n) {
    size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    if (i < n) y[i] = 1.0f / (1.0f + expf(-x[i]));
}

Tensor sigmoid_forward(Tensor x) {
    Tensor y = torch::empty_like(x);
    size_t n = x.numel();
    sigmoid_kernel<<<(unsigned)((n + 127) / 128), 128>>>(x.data_ptr<float>(), y.data_ptr<float>(), n);
    return y;
}
"""

cpp = r"""
#include <torch/extension.h>
using namespace torch;
Tensor sigmoid_forward(Tensor x);
"""

sig = load_inline(
    name="sigmoid_doc",
    cpp_sources=cpp,
    cuda_sources=cuda,
    functions={"sigmoid_forward": "Elementwise logistic sigmoid (CUDA)"},
)


class ModelNew(nn.Module):
    def forward(self, x):
        return sig.sigmoid_forward(x)
