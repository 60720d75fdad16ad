# reference: linear_relu
# expect: correct
# cuBLAS SGEMM in the wrapper (the current handle from ATen), then a bias + ReLU kernel.
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cuda_source = r"""
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>
#include <cublas_v2.h>

__global__ void bias_relu_kernel(float* __restrict__ y, const float* __restrict__ bias, int rows, int cols) {
    int idx = blockIdx.x * blockDim.x + threadIdx.x;
    if (idx < rows * cols) {
        float v = y[idx] + bias[idx % cols];
        y[idx] = v > 0.f ? v : 0.f;
    }
}

torch::Tensor linear_relu(torch::Tensor x, torch::Tensor weight, torch::Tensor bias) {
    const int batch = x.size(0), in_f = x.size(1), out_f = weight.size(0);
    auto y = torch::empty({batch, out_f}, x.options());
    cublasHandle_t handle = at::cuda::getCurrentCUDABlasHandle();
    const float alpha = 1.0f, beta = 0.0f;
    // Row-major y = x W^T is column-major y^T = W x^T.
    cublasSgemm(handle, CUBLAS_OP_T, CUBLAS_OP_N, out_f, batch, in_f, &alpha,
                weight.data_ptr<float>(), in_f, x.data_ptr<float>(), in_f, &beta, y.data_ptr<float>(), out_f);
    int total = batch * out_f;
    bias_relu_kernel<<<(total + 255) / 256, 256, 0, at::cuda::getCurrentCUDAStream()>>>(
        y.data_ptr<float>(), bias.data_ptr<float>(), batch, out_f);
    return y;
}
"""

ext = load_inline(
    name="linear_relu_cublas",
    cpp_sources="torch::Tensor linear_relu(torch::Tensor x, torch::Tensor weight, torch::Tensor bias);",
    cuda_sources=cuda_source,
    functions=["linear_relu"],
    extra_ldflags=["-lcublas"],
)


class ModelNew(nn.Module):
    def __init__(self, in_features=512, out_features=256):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)

    def forward(self, x):
        return ext.linear_relu(x.contiguous(), self.linear.weight, self.linear.bias)
