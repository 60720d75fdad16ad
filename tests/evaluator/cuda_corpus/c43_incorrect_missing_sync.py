# reference: transpose
# expect: incorrect
# Reads the tile before other threads wrote it (no __syncthreads) and writes untransposed blocks.
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

source = r"""
#include <torch/extension.h>

#define TILE 32

__global__ void transpose_kernel(const float* in, float* out, int rows, int cols) {
    __shared__ float tile[TILE][TILE];
    int x = blockIdx.x * TILE + threadIdx.x;
    int y = blockIdx.y * TILE + threadIdx.y;
    if (x < cols && y < rows) tile[threadIdx.y][threadIdx.x] = in[y * cols + x];
    if (x < rows && y < cols) out[y * rows + x] = tile[threadIdx.x][threadIdx.y];
}

torch::Tensor transpose(torch::Tensor in) {
    int rows = in.size(0), cols = in.size(1);
    auto out = torch::zeros({cols, rows}, in.options());
    dim3 block(TILE, TILE);
    dim3 grid((cols + TILE - 1) / TILE, (rows + TILE - 1) / TILE);
    transpose_kernel<<<grid, block>>>(in.data_ptr<float>(), out.data_ptr<float>(), rows, cols);
    return out;
}
"""

ext = load_inline(
    name="transpose_nosync",
    cpp_sources="torch::Tensor transpose(torch::Tensor in);",
    cuda_sources=source,
    functions=["transpose"],
)


class ModelNew(nn.Module):
    def forward(self, x):
        return ext.transpose(x)
