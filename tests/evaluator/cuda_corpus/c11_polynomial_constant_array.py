# reference: polynomial
# expect: correct
# Coefficients in a __constant__ array copied once per call with cudaMemcpyToSymbolAsync on the current stream.
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

poly_src = r"""
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>
#include <vector>

#define MAX_COEFFS 8

__constant__ float d_coeffs[MAX_COEFFS];

__global__ void horner_kernel(const float* __restrict__ x, float* __restrict__ y, int n, int degree) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    float v = x[i];
    float acc = 0.0f;
    #pragma unroll
    for (int k = MAX_COEFFS - 1; k >= 0; --k) {
        if (k < degree) acc = acc * v + d_coeffs[k];
    }
    y[i] = acc;
}

torch::Tensor polynomial(torch::Tensor x, std::vector<double> coeffs) {
    TORCH_CHECK(coeffs.size() <= MAX_COEFFS, "too many coefficients");
    float host[MAX_COEFFS] = {0};
    for (size_t k = 0; k < coeffs.size(); ++k) host[k] = static_cast<float>(coeffs[k]);
    auto stream = at::cuda::getCurrentCUDAStream();
    cudaMemcpyToSymbolAsync(d_coeffs, host, sizeof(host), 0, cudaMemcpyHostToDevice, stream);
    auto y = torch::empty_like(x);
    int n = x.numel();
    horner_kernel<<<(n + 255) / 256, 256, 0, stream>>>(x.data_ptr<float>(), y.data_ptr<float>(), n, (int)coeffs.size());
    return y;
}
"""

poly = load_inline(
    name="poly_const",
    cpp_sources="torch::Tensor polynomial(torch::Tensor x, std::vector<double> coeffs);",
    cuda_sources=poly_src,
    functions=["polynomial"],
)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.coeffs = [0.5, -1.0, 0.25, 0.125, -0.0625, 0.03125, 0.0, -0.01]

    def forward(self, x):
        return poly.polynomial(x, self.coeffs)
