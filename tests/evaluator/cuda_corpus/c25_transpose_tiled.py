# reference: transpose
# expect: correct
# Classic shared-memory transpose with a padded tile and 8-row blocks.
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

transpose_cuda = r"""
#include <torch/extension.h>

const int TILE_DIM = 32;
const int BLOCK_ROWS = 8;

__global__ void transpose_kernel(const float* __restrict__ in, float* __restrict__ out, int rows, int cols) {
    __shared__ float tile[TILE_DIM][TILE_DIM + 1];
    int x = blockIdx.x * TILE_DIM + threadIdx.x;
    int y = blockIdx.y * TILE_DIM + threadIdx.y;
    for (int j = 0; j < TILE_DIM; j += BLOCK_ROWS)
        if (x < cols && y + j < rows) tile[threadIdx.y + j][threadIdx.x] = in[(size_t)(y + j) * cols + x];
    __syncthreads();
    x = blockIdx.y * TILE_DIM + threadIdx.x;
    y = blockIdx.x * TILE_DIM + threadIdx.y;
    for (int j = 0; j < TILE_DIM; j += BLOCK_ROWS)
        if (x < rows && y + j < cols) out[(size_t)(y + j) * rows + x] = tile[threadIdx.x][threadIdx.y + j];
}

torch::Tensor transpose(torch::Tensor in) {
    int rows = in.size(0), cols = in.size(1);
    auto out = torch::empty({cols, rows}, in.options());
    dim3 grid((cols + TILE_DIM - 1) / TILE_DIM, (rows + TILE_DIM - 1) / TILE_DIM);
    dim3 block(TILE_DIM, BLOCK_ROWS);
    transpose_kernel<<<grid, block>>>(in.data_ptr<float>(), out.data_ptr<float>(), rows, cols);
    return out;
}
"""

tr = load_inline(
    name="transpose_tiled",
    cpp_sources="torch::Tensor transpose(torch::Tensor in);",
    cuda_sources=transpose_cuda,
    functions=["transpose"],
)


class ModelNew(nn.Module):
    def forward(self, x):
        return tr.transpose(x.contiguous())
