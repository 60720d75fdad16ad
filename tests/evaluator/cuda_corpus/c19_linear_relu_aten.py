# reference: linear_relu
# expect: correct
# ATen matmul in the wrapper, a fused bias + ReLU kernel after it.
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

source = r"""
#include <torch/extension.h>

__global__ void add_bias_relu(float* out, const float* bias, int64_t total, int64_t cols) {
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < total) out[i] = fmaxf(out[i] + bias[i % cols], 0.0f);
}

torch::Tensor fused_linear_relu(torch::Tensor x, torch::Tensor w, torch::Tensor b) {
    auto out = torch::matmul(x, w.t()).contiguous();
    int64_t total = out.numel();
    add_bias_relu<<<(total + 511) / 512, 512>>>(out.data_ptr<float>(), b.data_ptr<float>(), total, out.size(1));
    return out;
}
"""

fused = load_inline(
    name="fused_linear_relu",
    cpp_sources="torch::Tensor fused_linear_relu(torch::Tensor x, torch::Tensor w, torch::Tensor b);",
    cuda_sources=source,
    functions=["fused_linear_relu"],
)


class ModelNew(nn.Module):
    def __init__(self, in_features, out_features):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)

    def forward(self, x):
        return fused.fused_linear_relu(x, self.linear.weight, self.linear.bias)
