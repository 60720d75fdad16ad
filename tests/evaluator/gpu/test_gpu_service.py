"""The real evaluator service on a GPU: honest CUDA and Triton candidates pass, each adversarial kernel gets the
right verdict, and an honest candidate evaluated right after it on the same GPU is still correct.

All CUDA candidates here share one extension source, so it is built once (first test) and then comes from the
build cache; each candidate calls a different function of it.
"""

from __future__ import annotations

import concurrent.futures
import importlib.util
import os
import re
import threading
import time
from collections.abc import Iterator

import httpx
import pytest

torch = pytest.importorskip("torch")

from tests.evaluator import sources  # noqa: E402
from tests.servers import python_path, run_service  # noqa: E402

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]
needs_triton = pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="needs triton")

REFERENCE = """
import torch

class Model(torch.nn.Module):
    def forward(self, x):
        return torch.relu(x)

def get_inputs():
    return [torch.rand(2048, 2048)]   # [0, 1), as in KernelBench: `return x` would pass without signed draws

def get_init_inputs():
    return []
"""

EXTENSION = '''
import torch
from torch.utils.cpp_extension import load_inline

CUDA_SRC = r"""
#include <torch/extension.h>
#include <cassert>
__global__ void relu_kernel(const float* x, float* y, int64_t n) {
    int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (i < n) y[i] = x[i] > 0.f ? x[i] : 0.f;
}
__global__ void half_relu_kernel(const float* x, float* y, int64_t n) {  // writes only the first half
    int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (i < n / 2) y[i] = x[i] > 0.f ? x[i] : 0.f;
}
__global__ void oob_kernel(const float* x, float* y, int64_t n) {
    int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (i < n) y[i + (int64_t)1 << 40] = x[i];
}
__global__ void assert_kernel(const float* x, float* y, int64_t n) {
    int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (i < n) { assert(x[i] > 2.f); y[i] = x[i]; }
}
__global__ void spin_kernel(volatile int* flag) { while (*flag == 0) { } }
static int64_t blocks(int64_t n) { return (n + 255) / 256; }
torch::Tensor relu_fwd(torch::Tensor x) {
    auto y = torch::empty_like(x);
    relu_kernel<<<blocks(x.numel()), 256>>>(x.data_ptr<float>(), y.data_ptr<float>(), x.numel());
    return y;
}
torch::Tensor half_relu_fwd(torch::Tensor x) {
    auto y = torch::empty_like(x);
    half_relu_kernel<<<blocks(x.numel()), 256>>>(x.data_ptr<float>(), y.data_ptr<float>(), x.numel());
    return y;
}
torch::Tensor oob_fwd(torch::Tensor x) {
    auto y = torch::empty_like(x);
    oob_kernel<<<blocks(x.numel()), 256>>>(x.data_ptr<float>(), y.data_ptr<float>(), x.numel());
    return y;
}
torch::Tensor assert_fwd(torch::Tensor x) {
    auto y = torch::empty_like(x);
    assert_kernel<<<blocks(x.numel()), 256>>>(x.data_ptr<float>(), y.data_ptr<float>(), x.numel());
    return y;
}
torch::Tensor spin_fwd(torch::Tensor x) {
    auto flag = torch::zeros({1}, x.options().dtype(torch::kInt32));
    spin_kernel<<<1, 1>>>(flag.data_ptr<int>());
    return x.clone();
}
"""
CPP_SRC = """
torch::Tensor relu_fwd(torch::Tensor x);
torch::Tensor half_relu_fwd(torch::Tensor x);
torch::Tensor oob_fwd(torch::Tensor x);
torch::Tensor assert_fwd(torch::Tensor x);
torch::Tensor spin_fwd(torch::Tensor x);
"""
ext = load_inline(name="gpu_test_ext", cpp_sources=CPP_SRC, cuda_sources=CUDA_SRC,
                  functions=["relu_fwd", "half_relu_fwd", "oob_fwd", "assert_fwd", "spin_fwd"])
'''


def cuda_candidate(forward_body: str, prelude: str = "") -> str:
    return f"{EXTENSION}\n{prelude}\nclass ModelNew(torch.nn.Module):\n    def forward(self, x):\n{forward_body}\n"


HONEST_CUDA = cuda_candidate("        return ext.relu_fwd(x)")

TRITON_RELU = """
import torch
import triton
import triton.language as tl

@triton.jit
def relu_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(y_ptr + offs, tl.maximum(tl.load(x_ptr + offs, mask=mask), 0.0), mask=mask)

class ModelNew(torch.nn.Module):
    def forward(self, x):
        y = torch.empty_like(x)
        relu_kernel[(triton.cdiv(x.numel(), 1024),)](x, y, x.numel(), BLOCK=1024)
        return y
"""


def _served(tmp_path_factory: pytest.TempPathFactory, **settings: str) -> Iterator[str]:
    """A CUDA evaluator with 2 workers and 2 builders, a cache of its own and `settings` (EVALUATOR_*)."""
    cache = tmp_path_factory.mktemp("evaluator-cache")
    env = {
        "PYTHONPATH": python_path(),
        "EVALUATOR_CACHE_DIR": str(cache),
        "EVALUATOR_WORKERS": "2",
        "EVALUATOR_BUILD_WORKERS": "2",
        **{f"EVALUATOR_{name.upper()}": value for name, value in settings.items()},
    }
    with run_service("evaluator", env=env, log_path=cache / "service.log", timeout_s=300) as url:
        yield url


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    yield from _served(tmp_path_factory)


def evaluate(url: str, candidate: str, **overrides: object) -> dict:
    body = {
        "reference_source": REFERENCE,
        "candidate_source": candidate,
        "device": "cuda",
        "correctness_trials": 3,
        "timing_trials": 20,
        "warmup_trials": 3,
        "seed": 1234,
        **overrides,
    }
    response = httpx.post(f"{url}/evaluate", json=body, timeout=900)
    assert response.status_code == 200, response.text
    return response.json()


def assert_honest_still_correct(url: str) -> None:
    result = evaluate(url, HONEST_CUDA)
    assert result["status"] == "correct", result["message"]
    assert result["cache_hit"], "the shared extension should come from the build cache"


def test_honest_cuda_candidate_is_correct_and_timed(service: str) -> None:
    result = evaluate(service, HONEST_CUDA)
    assert result["status"] == "correct", result["message"]
    assert result["device"].startswith("cuda") and result["speedup"] > 0
    assert result["candidate_ms"]["n"] == 20 and result["reference_ms"]["median"] > 0
    # Advisory flags only: a 2048x2048 ReLU takes microseconds, short against the host's jitter around each call,
    # so the judge's clock may not resolve it (unverified_timing: no speed beyond the reference's credited).
    assert set(result["flags"]) <= {"timed_by_judge", "unverified_timing"}, result["flags"]


@needs_triton
def test_honest_triton_candidate_is_correct(service: str) -> None:
    result = evaluate(service, TRITON_RELU, require_custom_kernel=True)
    assert result["status"] == "correct", result["message"]
    assert result["flags"] == []


ADVERSARIAL = {
    # the output block is never written: it holds whatever the allocator hands out, NaN after our poisoning
    "uninitialised_output": (cuda_candidate("        return ext.half_relu_fwd(x)"), {"incorrect"}),
    "input_zeroing": (cuda_candidate("        y = ext.relu_fwd(x)\n        x.zero_()\n        return y"), {"rejected"}),
    "side_stream": (
        cuda_candidate(
            "        y = torch.empty_like(x)\n        s = torch.cuda.Stream()\n"
            "        with torch.cuda.stream(s):\n            for _ in range(20):\n"
            "                z = x @ x\n            y.copy_(x).clamp_min_(0.0)\n        return y"
        ),
        {"rejected"},
    ),
    "data_ptr_cache": (
        cuda_candidate(
            "        key = x.data_ptr()\n        if key not in CACHE:\n            CACHE[key] = ext.relu_fwd(x)\n"
            "        return CACHE[key]",
            prelude="CACHE = {}\n",
        ),
        {"incorrect", "rejected"},
    ),
    "identity_on_relu": (cuda_candidate("        return x"), {"incorrect"}),
    "timer_monkeypatch": (
        cuda_candidate(
            "        return ext.relu_fwd(x)", prelude="torch.cuda.Event.elapsed_time = lambda self, end: 1e-6\n"
        ),
        {"rejected"},
    ),
    "illegal_memory_access": (cuda_candidate("        return ext.oob_fwd(x)"), {"runtime_error", "crashed"}),
    "device_side_assert": (cuda_candidate("        return ext.assert_fwd(x)"), {"runtime_error", "crashed"}),
}


@pytest.mark.parametrize("name", sorted(ADVERSARIAL))
def test_adversarial_kernel_gets_its_verdict_and_the_gpu_stays_usable(service: str, name: str) -> None:
    source, verdicts = ADVERSARIAL[name]
    result = evaluate(service, source)
    assert result["status"] in verdicts, f"{name}: {result['status']} {result['flags']} {result['message'][-800:]}"
    assert_honest_still_correct(service)


def test_kernel_that_never_returns_times_out_and_the_gpu_recovers(service: str) -> None:
    result = evaluate(service, cuda_candidate("        return ext.spin_fwd(x)"), timeout_s=60)
    assert result["status"] == "timeout", result["message"][-800:]
    assert_honest_still_correct(service)


def test_an_output_forged_within_the_tolerance_is_caught_on_the_gpu(service: str) -> None:
    """The red team's forgery of the sketch when it was a sum of the raw bits (a correct output computed only when
    saved, its zeros rewritten within the tolerance to the bit sum of the zero tensor the timed call returned): on a
    GPU the sketch is now a hash of every byte, so the saved output is not the one the block committed to."""
    result = evaluate(
        service, sources.SKETCH_FORGED_WITHIN_TOLERANCE, reference_source=sources.HEAVY_REFERENCE, timeout_s=300
    )
    assert result["status"] == "rejected" and "result_tampering" in result["flags"], result
    assert "not the one its timed call produced" in result["message"], result["message"]


# The service keys its GPUs by the ids it hands out: its own CUDA_VISIBLE_DEVICES's (host ids), else torch's.
SERVED_GPU = (os.environ.get("CUDA_VISIBLE_DEVICES") or "0").split(",")[0].strip()


def test_the_service_knows_how_much_of_the_gpu_evaluations_may_reserve(service: str) -> None:
    # Known once the service has taken a worker on the GPU (it reads the GPU's size from the worker's start).
    assert evaluate(service, HONEST_CUDA)["status"] == "correct"
    memory = httpx.get(f"{service}/health").json()["details"]["device_memory_mb"][SERVED_GPU]
    total_mb = torch.cuda.get_device_properties(0).total_memory / (1 << 20)
    # The GPU's memory less a context for each of the 4 idle workers and 2 builders.
    assert abs(memory["capacity"] - (total_mb - 6 * 1024)) <= 1, memory
    assert memory["reserved"] == 0 and not memory["exclusive"], memory


# Evaluations of REFERENCE (16 MiB in, 16 MiB out) need 3.6 GiB (a timed block of 24 calls holds 0.8 GiB): one fits
# in 5,000 MiB, two do not.
ADMITTED_MB = 5000
# 1 GiB in and out (and a signed copy of the input): its run peaks above what the whole admission allows.
LARGE_REFERENCE = REFERENCE.replace("torch.rand(2048, 2048)", "torch.rand(1 << 28)")


@pytest.fixture(scope="module")
def admitted_service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    yield from _served(tmp_path_factory, device_memory_mb=str(ADMITTED_MB))


def test_evaluations_that_do_not_fit_together_wait_for_each_other(admitted_service: str) -> None:
    """Two evaluations at once on a GPU with room for one: the second waits for the first's workers to be gone (the
    service's health shows it waiting, and never more reserved than allowed), and both are correct."""
    seen: list[dict] = []
    done = threading.Event()

    def watch() -> None:
        while not done.is_set():
            seen.append(httpx.get(f"{admitted_service}/health").json()["details"]["device_memory_mb"][SERVED_GPU])
            time.sleep(0.05)

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            results = list(pool.map(lambda seed: evaluate(admitted_service, HONEST_CUDA, seed=seed), [11, 11]))
    finally:
        done.set()
        watcher.join()
    assert [result["status"] for result in results] == ["correct", "correct"], [r["message"] for r in results]
    assert all(state["capacity"] == ADMITTED_MB and state["reserved"] <= ADMITTED_MB for state in seen), seen
    assert any(state["waiting"] >= 1 and state["reserved"] > 0 for state in seen), seen
    assert max(result["phases_s"].get("device_wait", 0.0) for result in results) > 1.0, results


def test_a_problem_that_cannot_fit_is_refused_with_its_sizes(admitted_service: str) -> None:
    result = evaluate(admitted_service, HONEST_CUDA, reference_source=LARGE_REFERENCE)
    assert result["status"] == "evaluator_error", result
    assert re.search(r"its run peaked at \d+\.\d GiB.*\) needs \d+\.\d GiB of device memory", result["message"]), (
        result["message"]
    )
    assert f"may reserve {ADMITTED_MB / 1024:.1f} GiB" in result["message"], result["message"]


def test_checked_outputs_reach_the_timer_in_device_memory(service: str) -> None:
    """On a GPU every check's output goes from the candidate's worker to the reference's timer as an exported
    allocation (device_handover), not as a saved file the service copies."""
    result = evaluate(service, HONEST_CUDA)
    assert result["status"] == "correct", result["message"]
    phases = result["phases_s"]
    assert phases["compare_handover"] > 0 and phases["compare_copy"] == 0, phases


def test_a_reference_that_reuses_its_output_memory_has_every_call_checked_on_the_gpu(service: str) -> None:
    """test_judge.py's candidate that computes only the last call of each block against a reference that returns
    one buffer it keeps, on the GPU: each call's output is copied as it returns, on both sides, and checked."""
    from tests.evaluator.test_judge import LAST_CALL_ONLY, OUTPUT_BUFFER_REFERENCE

    reference = OUTPUT_BUFFER_REFERENCE.replace("384", "2048")
    result = evaluate(service, LAST_CALL_ONLY, reference_source=reference, timing_trials=40)
    assert result["status"] in {"incorrect", "rejected"}, f"{result['status']} {result['flags']} {result['message']}"
    honest = reference.replace("class Model(", "class ModelNew(")
    result = evaluate(service, honest, reference_source=reference, timing_trials=40)
    assert result["status"] == "correct", f"{result['flags']} {result['message']}"
    assert result["speedup"] is not None and 0.8 < result["speedup"] < 1.25, result


def test_no_code_of_the_candidates_runs_in_the_runners_steps_on_the_gpu(service: str) -> None:
    """test_judge.py's watcher of the runner's steps, its kernels for torch's copy and clone registered for CUDA: the
    outputs' copies move bytes by the CUDA driver (as the refills of input buffers did, when every call took one set
    of them), so none of its code runs there and its answers stay right (through torch's copy its kernels ran there,
    and it answered wrongly)."""
    from tests.evaluator.test_judge import ADD_REFERENCE, WATCHES_THE_RUNNERS_STEPS

    candidate = WATCHES_THE_RUNNERS_STEPS.replace('"AutogradCPU"', '"AutogradCUDA"')
    assert candidate.count("AutogradCUDA") == 2
    result = evaluate(service, candidate, reference_source=ADD_REFERENCE, timing_trials=10)
    assert result["status"] in ("correct", "rejected"), f"{result['status']} {result['message'][-800:]}"
    assert not {"stale_output", "result_tampering"} & set(result["flags"]), f"{result['flags']} {result['message']}"


# A candidate right only on non-negative inputs: it returns its input where every element is (one read of it,
# against the ReLU's read and write) and computes the ReLU where not, so it passes the signed correctness trials.
SHORTCUT_WHERE_NON_NEGATIVE = """
import torch

class ModelNew(torch.nn.Module):
    def forward(self, x):
        if bool(x.min() >= 0):
            return x
        return torch.relu(x)
"""


def test_a_candidate_right_only_on_non_negative_inputs_is_timed_on_signed_ones(service: str) -> None:
    """Timed on KernelBench's `torch.rand` draws alone, it would take the shortcut in every timed call (about 2x on a
    1 GiB ReLU, by the traffic). Every timed set is drawn signed where the reference's output allowed signed trials,
    so its timed calls compute the ReLU after the check."""
    reference = REFERENCE.replace("2048, 2048", "16384, 16384")
    result = evaluate(service, SHORTCUT_WHERE_NON_NEGATIVE, reference_source=reference)
    assert result["status"] != "correct" or result["speedup"] < 1.3, result


def test_no_kernel_of_the_candidates_runs_in_the_outputs_copy_on_the_gpu(service: str) -> None:
    """test_judge.py's candidate that leaves half of each answer to its own kernel for torch's clone, registered for
    CUDA: the copy is the driver's, so that half stays undone in the buffer it copies (stale_output)."""
    from tests.evaluator.test_judge import HALF_IN_THE_COPY, HOOKS_ON_THE_COPY, OUTER_REFERENCE

    hook = HOOKS_ON_THE_COPY["registered_kernel"].replace('"AutogradCPU"', '"AutogradCUDA"')
    candidate = HALF_IN_THE_COPY.replace("{hook}", hook)
    assert "AutogradCUDA" in candidate
    result = evaluate(service, candidate, reference_source=OUTER_REFERENCE, timing_trials=20)
    assert result["status"] == "rejected", f"{result['status']} {result['flags']} {result['message'][-800:]}"
