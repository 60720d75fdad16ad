"""Real builds of the lighter CUDA include: a typical wrapper builds against torch/types.h; a source that needs
torch/extension.h builds after the fall-back; both compute the right thing."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from services.evaluator import build_cache  # noqa: E402

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


@pytest.fixture(autouse=True)
def whole_builds(monkeypatch: pytest.MonkeyPatch) -> None:
    """The header rewrite is the whole build's (a split build's .cu includes no torch header at all)."""
    monkeypatch.setenv("EVALUATOR_SPLIT_BUILD", "0")


CPP = "torch::Tensor scaled(torch::Tensor x, double s);"
# What candidates write: TORCH_CHECK, the dispatch macro, torch:: factories, all in the .cu.
TYPICAL = r"""
#include <torch/extension.h>
template <typename T>
__global__ void scale_kernel(const T* x, T* y, T s, int64_t n) {
    int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (i < n) y[i] = x[i] * s;
}
torch::Tensor scaled(torch::Tensor x, double s) {
    TORCH_CHECK(x.is_cuda(), "x must be a CUDA tensor");
    auto y = torch::empty_like(x);
    int64_t n = x.numel();
    AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "scaled", [&] {
        scale_kernel<scalar_t><<<(n + 255) / 256, 256>>>(
            x.data_ptr<scalar_t>(), y.data_ptr<scalar_t>(), static_cast<scalar_t>(s), n);
    });
    return y;
}
"""
# torch::nn::functional lives in torch/all.h, which only torch/extension.h brings in.
NEEDS_FULL = r"""
#include <torch/extension.h>
torch::Tensor scaled(torch::Tensor x, double s) {
    return torch::nn::functional::relu(x) * s;
}
"""


def _load(tmp_path: Path, source: str) -> tuple[Any, dict[str, Any]]:
    """Build as the builder worker does (no load there), then load the library as the candidate's worker does."""
    cache = tmp_path / "cache"
    build_cache.prepare(cache)
    kind, arguments = build_cache.parse_request(
        {"kind": "load_inline", "arguments": {"name": "probe", "cpp_sources": [CPP], "cuda_sources": [source],
                                               "functions": ["scaled"]}},
        "cuda",
    )  # fmt: skip
    key = build_cache.cache_key(kind, arguments, build_cache.device_arch("cuda"))
    build_dir = tmp_path / "build" / key
    build_dir.mkdir(parents=True)
    built = build_cache.build({"kind": kind, "arguments": arguments, "key": key}, build_dir, "cuda", cache)
    name = build_cache.library_name(key)
    assert f"{name}.so" in built.files  # the name the cache publishes and looks up
    return build_cache._load_library(build_dir / f"{name}.so", name, True), {"light_headers": built.light_headers}


def test_typical_wrapper_builds_against_the_light_header(tmp_path: Path) -> None:
    module, built = _load(tmp_path, TYPICAL)
    assert built["light_headers"] is True
    assert "torch/types.h" in next((tmp_path / "build").glob("*/cuda.cu")).read_text()
    x = torch.randn(10_000, device="cuda", dtype=torch.float64)
    torch.testing.assert_close(module.scaled(x, 3.0), x * 3.0)


def test_source_that_needs_the_full_header_falls_back_and_builds(tmp_path: Path) -> None:
    module, built = _load(tmp_path, NEEDS_FULL)
    assert built["light_headers"] is False
    assert "torch/extension.h" in next((tmp_path / "build").glob("*/cuda.cu")).read_text()
    x = torch.randn(10_000, device="cuda")
    torch.testing.assert_close(module.scaled(x, 2.0), torch.relu(x) * 2.0)
