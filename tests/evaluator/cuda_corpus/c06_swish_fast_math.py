# reference: swish
# expect: correct
# __expf and --use_fast_math; the launch uses dim3.
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

swish_kernel_code = r"""
#include <torch/extension.h>

__global__ void swish_kernel(const float* __restrict__ x, float* __restrict__ out, const int64_t numel) {
    const int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
    if (idx < numel) {
        const float v = x[idx];
        out[idx] = v / (1.0f + __expf(-v));
    }
}

torch::Tensor swish(torch::Tensor x) {
    TORCH_CHECK(x.scalar_type() == torch::kFloat32, "float32 only");
    auto out = torch::empty_like(x);
    const int64_t numel = x.numel();
    dim3 block(256);
    dim3 grid((numel + block.x - 1) / block.x);
    swish_kernel<<<grid, block>>>(x.data_ptr<float>(), out.data_ptr<float>(), numel);
    return out;
}
"""

swish_ext = load_inline(
    name="swish_fast",
    cpp_sources=["torch::Tensor swish(torch::Tensor x);"],
    cuda_sources=[swish_kernel_code],
    functions=["swish"],
    extra_cuda_cflags=["-O3", "--use_fast_math"],
)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        return swish_ext.swish(x)
