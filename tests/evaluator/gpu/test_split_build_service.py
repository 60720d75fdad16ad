"""The real evaluator service on a GPU with split builds on (EVALUATOR_SPLIT_BUILD=1): a split build may save time,
never change a verdict.

A correct candidate keeps its split build (`build_path: split`, the split parts in `phases_s`); an incorrect one
is evaluated again built whole (`build_path: fallback`) and the whole build's verdict is the result, the whole
library under a cache key of its own beside the split one. Corpus candidates: tests/evaluator/cuda_corpus.

Run from the source tree on a CUDA machine:
`PYTHONPATH=. python -m pytest -m gpu tests/evaluator/gpu/test_split_build_service.py`.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("tree_sitter_cuda")

from tests.evaluator import cuda_corpus  # noqa: E402
from tests.servers import python_path, run_service  # noqa: E402

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.timeout(1800),
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("evaluator-cache")


@pytest.fixture(scope="module")
def service(cache_dir: Path) -> Iterator[str]:
    env = {
        "PYTHONPATH": python_path(),
        "EVALUATOR_CACHE_DIR": str(cache_dir),
        "EVALUATOR_WORKERS": "1",
        "EVALUATOR_SPLIT_BUILD": "1",
    }
    with run_service("evaluator", env=env, log_path=cache_dir / "service.log", timeout_s=300) as url:
        yield url


def _evaluate(url: str, name: str) -> dict[str, Any]:
    case = next(c for c in cuda_corpus.cases() if c.name == name)
    body = {
        "reference_source": case.reference_source,
        "candidate_source": case.source,
        "device": "cuda",
        "correctness_trials": 3,
        "timing_trials": 10,
        "seed": 1234,
        "timeout_s": 900,
    }
    response = httpx.post(f"{url}/evaluate", json=body, timeout=1200)
    assert response.status_code == 200, response.text
    return response.json()


def _records(cache_dir: Path) -> dict[str, str]:
    return {
        entry.name: json.loads((entry / "build.json").read_text())["build_path"]
        for entry in cache_dir.iterdir()
        if (entry / "build.json").is_file()
    }


def test_a_correct_split_built_candidate_keeps_its_split_build(service: str, cache_dir: Path) -> None:
    result = _evaluate(service, "c01_relu_basic")
    assert result["status"] == "correct", result["message"]
    assert result["build_path"] == "split"
    assert {"build_split_device", "build_split_host", "build_split_link"} <= set(result["phases_s"])
    assert "split_run" not in result["phases_s"] and "build_whole" not in result["phases_s"]
    assert list(_records(cache_dir).values()) == ["split"]


def test_an_incorrect_split_built_candidate_is_judged_by_its_whole_build(service: str, cache_dir: Path) -> None:
    before = _records(cache_dir)
    result = _evaluate(service, "c42_incorrect_off_by_one")
    assert result["status"] == "incorrect", result["message"]
    assert result["build_path"] == "fallback"
    assert result["phases_s"]["split_run"] > 0 and result["phases_s"]["build_whole"] > 0
    new = {key: path for key, path in _records(cache_dir).items() if key not in before}
    assert sorted(new.values()) == ["split", "whole"], new  # the whole rebuild compiled a library of its own
    # Both libraries cached: the split run hits the split one, the whole run the whole one.
    again = _evaluate(service, "c42_incorrect_off_by_one")
    assert again["status"] == "incorrect" and again["build_path"] == "fallback" and again["cache_hit"]
    assert _records(cache_dir) == {**before, **new}
