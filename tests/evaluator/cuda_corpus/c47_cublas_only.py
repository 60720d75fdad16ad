# reference: matmul
# expect: correct
# No kernel of its own: cublasSgemm through ATen's handle (nothing to split).
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

source = r"""
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>
#include <cublas_v2.h>

torch::Tensor matmul_cublas(torch::Tensor A, torch::Tensor B) {
    int M = A.size(0), K = A.size(1), N = B.size(1);
    auto C = torch::empty({M, N}, A.options());
    float alpha = 1.f, beta = 0.f;
    auto handle = at::cuda::getCurrentCUDABlasHandle();
    cublasSgemm(handle, CUBLAS_OP_N, CUBLAS_OP_N, N, M, K, &alpha, B.data_ptr<float>(), N, A.data_ptr<float>(), K,
                &beta, C.data_ptr<float>(), N);
    return C;
}
"""

ext = load_inline(
    name="matmul_cublas",
    cpp_sources="torch::Tensor matmul_cublas(torch::Tensor A, torch::Tensor B);",
    cuda_sources=source,
    functions=["matmul_cublas"],
    extra_ldflags=["-lcublas"],
)


class ModelNew(nn.Module):
    def forward(self, A, B):
        return ext.matmul_cublas(A.contiguous(), B.contiguous())
