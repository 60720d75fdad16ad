"""2-D convolution, batch normalization and ReLU on an NCHW batch.

The model runs as constructed (training mode), so batch normalization normalizes with the statistics of the
current batch.
"""

import torch
import torch.nn as nn

PROFILE = "cpu"
SIZES = {
    "cpu": {"batch_size": 8, "in_channels": 16, "out_channels": 32, "height": 32, "width": 32},
    "gpu": {"batch_size": 64, "in_channels": 64, "out_channels": 128, "height": 128, "width": 128},
}
batch_size = SIZES[PROFILE]["batch_size"]
in_channels = SIZES[PROFILE]["in_channels"]
out_channels = SIZES[PROFILE]["out_channels"]
height = SIZES[PROFILE]["height"]
width = SIZES[PROFILE]["width"]
kernel_size = 3


class Model(nn.Module):
    def __init__(self, in_channels, out_channels, kernel_size):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size, padding=kernel_size // 2)
        self.bn = nn.BatchNorm2d(out_channels)

    def forward(self, x):
        x = self.conv(x)
        x = self.bn(x)
        x = torch.relu(x)
        return x


def get_inputs():
    return [torch.randn(batch_size, in_channels, height, width)]


def get_init_inputs():
    return [in_channels, out_channels, kernel_size]
