"""The device hash (chunk_hash.cu), compiled for the host by g++ with every thread of a launch run in turn: its
BLAKE2s is Python's hashlib.blake2s, and output_digest's launches over it (levels, calls, grid, unaligned views)
give the tree root the service computes with hashlib from the saved copy. On a GPU the same is checked of the
NVRTC build (test_output_digest.py's gpu test) and by every worker before its first block."""

from __future__ import annotations

import ctypes
import hashlib
import random
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from services.evaluator import output_digest  # noqa: E402

SOURCE = Path(__file__).resolve().parents[2] / "services" / "evaluator" / "chunk_hash.cu"

# The kernel's body on the host: one digest, and a launch (every block and thread of the grid, in turn).
HARNESS = r"""
#define KA_FN static inline
#define KA_HOST_ONLY
#include "chunk_hash.cu"

extern "C" void digest(const ka_u8* data, ka_u32 length, ka_u8* out) { ka_blake2s(data, length, out); }

extern "C" void launch(int grid_x, int grid_y, int block_x, const ka_u64* sources, ka_u8* out, int chunks,
                       int last_length) {
    for (int call = 0; call < grid_y; ++call)
        for (int block = 0; block < grid_x; ++block)
            for (int thread = 0; thread < block_x; ++thread)
                ka_chunk_hash(sources, out, chunks, last_length, call, block * block_x + thread);
}
"""


@pytest.fixture(scope="module")
def host_build(tmp_path_factory: pytest.TempPathFactory) -> ctypes.CDLL:
    compiler = shutil.which("g++")
    if compiler is None:
        pytest.skip("needs g++")
    directory = tmp_path_factory.mktemp("chunk_hash")
    (directory / "harness.cpp").write_text(HARNESS)
    library = directory / "harness.so"
    command = [compiler, "-O2", "-shared", "-fPIC", "-I", str(SOURCE.parent), str(directory / "harness.cpp")]
    subprocess.run([*command, "-o", str(library)], check=True)
    return ctypes.CDLL(str(library))


def _digest(host_build: ctypes.CDLL, data: bytes) -> bytes:
    buffer = torch.frombuffer(bytearray(data), dtype=torch.uint8) if data else torch.empty(0, dtype=torch.uint8)
    out = torch.zeros(32, dtype=torch.uint8)
    aligned = buffer.clone()
    host_build.digest(ctypes.c_void_p(aligned.data_ptr()), ctypes.c_uint32(len(data)), ctypes.c_void_p(out.data_ptr()))
    return out.numpy().tobytes()


class HostLaunch:
    """Stands for the NVRTC kernel in output_digest._device_roots, on CPU tensors; records the launches."""

    def __init__(self, host_build: ctypes.CDLL) -> None:
        self.host_build = host_build
        self.grids: list[tuple[int, int, int]] = []

    def __call__(self, grid: tuple[int, int, int], block: tuple[int, int, int], args: list[Any]) -> None:
        sources, out, chunks, last_length = args
        assert sources.dtype == torch.int64 and out.dtype == torch.uint8 and out.is_contiguous()
        assert out.numel() == grid[1] * chunks * output_digest.DIGEST_BYTES
        assert grid[0] * block[0] >= chunks > (grid[0] - 1) * block[0]  # every chunk has a thread, no idle block
        assert 0 < last_length <= output_digest.TREE_CHUNK
        self.grids.append(grid)
        self.host_build.launch(
            grid[0], grid[1], block[0], ctypes.c_void_p(sources.data_ptr()), ctypes.c_void_p(out.data_ptr()),
            chunks, last_length,
        )  # fmt: skip


@pytest.mark.parametrize("length", [0, 1, 3, 4, 63, 64, 65, 128, 1000, 4095, 4096])
def test_blake2s_of_random_bytes_is_hashlibs(host_build: ctypes.CDLL, length: int) -> None:
    rng = random.Random(length)
    for _ in range(3):
        data = rng.randbytes(length)
        assert _digest(host_build, data) == hashlib.blake2s(data).digest()


def test_one_bit_changes_the_digest(host_build: ctypes.CDLL) -> None:
    data = bytearray(4096)
    digests = {_digest(host_build, bytes(data))}
    for position in (0, 2047, 4095):
        flipped = bytearray(data)
        flipped[position] ^= 0x80
        digests.add(_digest(host_build, bytes(flipped)))
    assert len(digests) == 4


# Lengths: within one digest, one chunk, a chunk and a byte, several levels, more chunks than a block has threads.
@pytest.mark.parametrize("length", [1, 32, 33, 4096, 4097, 3 * 4096 + 41, 129 * 4096 + 7, 5 << 20])
@pytest.mark.parametrize("calls", [1, 3])
def test_the_launches_give_the_services_tree_root(host_build: ctypes.CDLL, length: int, calls: int) -> None:
    generator = torch.Generator().manual_seed(length + calls)
    buffers = [torch.randint(256, (length + 1,), dtype=torch.uint8, generator=generator) for _ in range(calls)]
    aligned = [b[:length] for b in buffers]
    shifted = [b[1:] for b in buffers]  # off a 16-byte boundary: the launch takes an aligned copy
    for raws in (aligned, shifted):
        launch = HostLaunch(host_build)
        expected = [output_digest._host_root(raw.numpy().data) for raw in raws]
        assert output_digest._device_roots(launch, raws) == expected
        assert all(grid[1] == calls for grid in launch.grids)
        assert len(launch.grids) == _levels(length)


def _levels(length: int) -> int:
    """Levels above the raw bytes: each a digest of every 4 KiB of the one below, until 32 bytes at most remain."""
    levels = 0
    while length > 32:
        length, levels = -(-length // 4096) * 32, levels + 1
    return levels


def test_calls_of_one_block_get_their_own_roots(host_build: ctypes.CDLL) -> None:
    """Equal buffers give equal roots and one changed byte changes only its call's."""
    raws = [torch.zeros(3 * 4096 + 5, dtype=torch.uint8) for _ in range(4)]
    raws[2][4096 * 2 + 1] = 1
    roots = output_digest._device_roots(HostLaunch(host_build), raws)
    assert roots[0] == roots[1] == roots[3] != roots[2]


def test_the_kernel_compiles_for_a_gpu(tmp_path: Path) -> None:
    """nvcc (the NVRTC front end's twin) takes the source as the worker's NVRTC does, the kernel included."""
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        pytest.skip("needs nvcc")
    ptx = tmp_path / "chunk_hash.ptx"
    subprocess.run([nvcc, "-arch=sm_90", "-ptx", str(SOURCE), "-o", str(ptx)], check=True, capture_output=True)
    assert ".entry ka_chunk_hashes(" in ptx.read_text()
