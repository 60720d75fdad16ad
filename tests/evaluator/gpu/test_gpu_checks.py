"""The GPU timing and hack-check building blocks, each shown to catch its attack (and to pass honest code).
Side streams and forged reports are the judge's to see, from outside the process (tests/evaluator/gpu/test_gpu_service.py)."""

from __future__ import annotations

import importlib.util
import os
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from services.evaluator import gpu_checks  # noqa: E402
from services.evaluator.backends.cuda import CudaBackend  # noqa: E402

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]
DEV = "cuda:0"


@pytest.fixture(scope="module")
def backend() -> CudaBackend:
    b = CudaBackend(0)
    b.activate()
    return b


# A worker's life in small: a block's 1 GiB of inputs freed, then what the judge's commands run before the next
# draw (a timed call with its L2 flush, the digest of the outputs), then the next 1 GiB draw. Prints how much the
# cache grew for that draw: 0 when it reused the freed block whole.
REUSE_SCRIPT = """
import sys, torch
from services.evaluator import output_digest
from services.evaluator.backends.cuda import CudaBackend
backend = CudaBackend(0)
if sys.argv[1] == "activate":
    backend.activate()
drawn = torch.empty(1 << 28, device="cuda:0")
out = torch.rand(1 << 20, device="cuda:0")
del drawn
backend.time_call(torch.neg, [out])
output_digest.block_digest([out], 7)
reserved = torch.cuda.memory_reserved()
drawn = torch.empty(1 << 28, device="cuda:0")
print(torch.cuda.memory_reserved() - reserved)
"""


def _cache_growth_at_next_draw(mode: str) -> int:
    repo = Path(__file__).resolve().parents[3]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(repo), os.environ.get("PYTHONPATH")]))}
    done = subprocess.run(
        [sys.executable, "-c", REUSE_SCRIPT, mode], capture_output=True, text=True, env=env, cwd=repo, timeout=300
    )
    assert done.returncode == 0, done.stderr
    return int(done.stdout.split()[-1])


def test_what_a_worker_keeps_never_splits_a_freed_input_set() -> None:
    """After activate(), nothing the worker's own code keeps (the flush buffer, cuBLAS's workspace) is carved out of
    a freed input set, so the next draw reuses it whole. Without it, the first timed call and the first digest carve
    theirs out of it, and the draw needs a new 1 GiB (on an 80 GB GPU a 16 GiB problem ran out of memory so)."""
    assert _cache_growth_at_next_draw("activate") == 0
    assert _cache_growth_at_next_draw("lazy") >= 1 << 30  # the scenario does split the block without it


def time_calls(backend: CudaBackend, fn, args: list, n: int) -> list[float]:  # noqa: ANN001
    return [backend.time_call(fn, args)[0] for _ in range(n)]


def test_backend_describes_device_and_times_a_copy(backend: CudaBackend) -> None:
    assert backend.available() and backend.device_string() == "cuda:0"
    assert "sm_" in backend.describe()
    x = torch.randn(32 * 2**20, device=DEV)
    time_calls(backend, lambda t: t.clone(), [x], 3)  # warm-up: the first clone also allocates
    samples = time_calls(backend, lambda t: t.clone(), [x], 30)
    assert len(samples) == 30 and min(samples) > 0
    # 256 MB read + written: at most a few ms on any datacenter GPU, and repeatable within 10 %
    med = statistics.median(samples)
    assert med < 20 and statistics.pstdev(samples) / med < 0.1


def test_timing_sees_the_faster_function(backend: CudaBackend) -> None:
    x = torch.randn(8192, 4096, device=DEV)
    slow = time_calls(backend, lambda t: (t * 2).exp().sin().cos(), [x], 20)
    fast = time_calls(backend, lambda t: t * 2, [x], 20)
    assert statistics.median(fast) * 2 < statistics.median(slow)


def test_poisoned_blocks_expose_an_uninitialised_output() -> None:
    x = torch.randn(4096, 1024, device=DEV)

    def uninitialised(t: torch.Tensor) -> torch.Tensor:
        return torch.empty_like(t)

    ref = torch.relu(x)
    expected = ref.clone()
    del ref  # the reference's output block goes back to the allocator ...
    stolen = uninitialised(x)  # ... and the "candidate" gets it back, full of the right answer
    assert torch.equal(stolen, expected)
    del stolen
    gpu_checks.poison_freed_blocks([expected], DEV)
    assert torch.isnan(uninitialised(x)).all()


def test_signed_draw_breaks_identity_on_relu() -> None:
    unsigned = gpu_checks.device_inputs(lambda: [torch.rand(1 << 16)], 3, DEV, signed=False)
    signed = gpu_checks.device_inputs(lambda: [torch.rand(1 << 16)], 3, DEV, signed=True)
    assert unsigned[0].is_cuda and torch.equal(torch.relu(unsigned[0]), unsigned[0])
    assert not torch.equal(torch.relu(signed[0]), signed[0])
    assert signed[0].min() < 0 < signed[0].max()


def test_device_inputs_are_reproducible_from_the_seed() -> None:
    a = gpu_checks.device_inputs(lambda: [torch.randn(1000), 3], 11, DEV, signed=False)
    b = gpu_checks.device_inputs(lambda: [torch.randn(1000), 3], 11, DEV, signed=False)
    assert torch.equal(a[0], b[0]) and a[1] == 3


def test_timer_patch_is_reported_by_the_worker_guard() -> None:
    from services.evaluator.guards import Guard

    guard = Guard()
    original = torch.cuda.Event.elapsed_time
    torch.cuda.Event.elapsed_time = lambda self, end: 1e-6  # type: ignore[method-assign]
    try:
        assert "torch.cuda.Event.elapsed_time" in guard.replaced()
    finally:
        torch.cuda.Event.elapsed_time = original  # type: ignore[method-assign]
    assert guard.replaced() == []


def test_backend_timing_ignores_a_patched_timer(backend: CudaBackend) -> None:
    original = torch.cuda.Event.elapsed_time
    torch.cuda.Event.elapsed_time = lambda self, end: 1e-6  # type: ignore[method-assign]
    try:
        samples = time_calls(backend, torch.relu, [torch.randn(32 * 2**20, device=DEV)], 5)
    finally:
        torch.cuda.Event.elapsed_time = original  # type: ignore[method-assign]
    assert min(samples) > 1e-3


def test_own_kernel_names_from_cuda_and_triton_sources() -> None:
    source = (
        'cuda_src = """\n__global__ void __launch_bounds__(256) fused_relu(const float* x) {}\n'
        'template <typename T> __global__ void scale_kernel(T* y) {}\n"""\n'
        "import triton\n@triton.jit\ndef add_kernel(x_ptr):\n    pass\n"
        "@triton.autotune(configs=[], key=[])\n@triton.jit\ndef tuned(x_ptr):\n    pass\n"
    )
    assert gpu_checks.own_kernel_names(source) == {"fused_relu", "scale_kernel", "add_kernel", "tuned"}


def test_profiler_lists_launched_kernels() -> None:
    x = torch.randn(1 << 20, device=DEV)
    names = gpu_checks.launched_kernel_names(torch.relu, [x])
    assert names and not gpu_checks.launches_own_kernel(names, {"fused_relu"})


@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="needs triton")
def test_profiler_sees_a_triton_kernel() -> None:
    import triton
    import triton.language as tl

    @triton.jit
    def double_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        tl.store(y_ptr + offs, tl.load(x_ptr + offs, mask=offs < n) * 2, mask=offs < n)

    def double(x: torch.Tensor) -> torch.Tensor:
        y = torch.empty_like(x)
        double_kernel[(triton.cdiv(x.numel(), 1024),)](x, y, x.numel(), BLOCK=1024)
        return y

    x = torch.randn(1 << 20, device=DEV)
    assert torch.equal(double(x), x * 2)
    assert gpu_checks.launches_own_kernel(gpu_checks.launched_kernel_names(double, [x]), {"double_kernel"})


def test_bandwidth_and_physical_bound() -> None:
    bw = gpu_checks.measure_bandwidth_gbs(DEV)
    assert 300 < bw < 20_000  # GB/s: any datacenter GPU, counting reads plus writes
    x = torch.randn(256 * 2**20, device=DEV)  # 1 GiB
    floor = gpu_checks.physical_floor_ms([x], bw)
    assert gpu_checks.beyond_physical_bound(floor * 0.1, floor, 0.5)
    assert not gpu_checks.beyond_physical_bound(floor * 1.2, floor, 0.5)
    assert not gpu_checks.beyond_physical_bound(0.0, gpu_checks.physical_floor_ms([torch.ones(8, device=DEV)], bw), 0.5)
