"""A split build may save time, never change a verdict: a split-built candidate that fails is evaluated again with
every extension built whole, and the result says which build path decided (`build_path`).

Nothing splits on a CPU, so the evaluation tests here run a real evaluator (its pool, workers and judge, in this
process) on pure-PyTorch candidates and record, for each run the judge allows to split, the path a CUDA builder
would have recorded for the candidate's extension. The real split build behind it runs in
tests/evaluator/gpu/test_split_build_service.py.
"""

from __future__ import annotations

import asyncio
import json
import math
import tempfile
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from services.evaluator import build_cache, evaluation
from services.evaluator.config import Settings
from services.evaluator.evaluation import Evaluator, Judge
from services.evaluator.pool import WorkerPool
from services.evaluator.verdict import SPLIT_SENSITIVE, CandidateRun, candidate_result, needs_whole_rebuild
from shared.contracts import EvaluateRequest, EvaluationResult, EvaluationStatus
from tests.evaluator import sources


def _result(status: EvaluationStatus, build_path: str | None) -> EvaluationResult:
    return EvaluationResult(status=status, compiled=True, correct=status is EvaluationStatus.correct,
                            build_path=build_path)  # fmt: skip


@pytest.mark.parametrize("status", list(EvaluationStatus))
@pytest.mark.parametrize("build_path", [None, "whole", "fallback", "split"])
def test_only_a_split_build_behind_a_failure_it_could_cause_is_rebuilt_whole(
    status: EvaluationStatus, build_path: str | None
) -> None:
    rebuilt = needs_whole_rebuild(_result(status, build_path))
    expected = build_path == "split" and status in {
        EvaluationStatus.compile_error,
        EvaluationStatus.runtime_error,
        EvaluationStatus.incorrect,
        EvaluationStatus.timeout,
        EvaluationStatus.crashed,
    }
    assert rebuilt is expected
    assert EvaluationStatus.rejected not in SPLIT_SENSITIVE and EvaluationStatus.correct not in SPLIT_SENSITIVE


def test_one_split_library_makes_the_run_split_built() -> None:
    assert CandidateRun().build_path is None
    assert CandidateRun(build_paths=["whole", "whole"]).build_path == "whole"
    assert CandidateRun(build_paths=["whole", "fallback"]).build_path == "fallback"
    assert CandidateRun(build_paths=["fallback", "split", "whole"]).build_path == "split"
    run = CandidateRun(build_paths=["split"])
    assert candidate_result(run, frozenset(), 4000).build_path == "split"


def test_build_path_is_in_the_result_contract() -> None:
    assert _result(EvaluationStatus.correct, None).model_dump()["build_path"] is None
    parsed = EvaluationResult.model_validate_json(_result(EvaluationStatus.incorrect, "fallback").model_dump_json())
    assert parsed.build_path == "fallback"
    schema = EvaluationResult.model_json_schema()["properties"]["build_path"]
    assert {"enum": ["split", "whole", "fallback"], "type": "string"} in schema["anyOf"]
    with pytest.raises(ValidationError):
        _result(EvaluationStatus.correct, "partly")


def test_the_service_records_the_path_of_what_it_publishes(tmp_path: Path) -> None:
    cache_dir, root = tmp_path / "cache", tmp_path / "builder"
    build_cache.prepare(cache_dir)
    (root / "home" / "build").mkdir(parents=True)
    for key, path in (("a" * 64, "split"), ("b" * 64, "fallback"), ("c" * 64, "whole")):
        name = f"{build_cache.library_name(key)}.so"
        (root / "home" / "build" / name).write_bytes(b"library")
        # A file the builder names like the record is not published: the record is the service's.
        (root / "home" / "build" / build_cache.BUILD_RECORD).write_text('{"build_path": "whole"}')
        build_cache.publish(cache_dir, root, None, key, [name, build_cache.BUILD_RECORD], path)
        assert json.loads((cache_dir / key / build_cache.BUILD_RECORD).read_text()) == {"build_path": path}
    assert build_cache.recorded_build_path(cache_dir, "a" * 64, split_asked=True) == "split"
    assert build_cache.recorded_build_path(cache_dir, "b" * 64, split_asked=True) == "fallback"
    # A key asked for no split holds a whole build whatever its record says.
    assert build_cache.recorded_build_path(cache_dir, "a" * 64, split_asked=False) == "whole"
    # A split key's library without a record (published before records were kept) is taken for a split one.
    (cache_dir / ("a" * 64) / build_cache.BUILD_RECORD).unlink()
    assert build_cache.recorded_build_path(cache_dir, "a" * 64, split_asked=True) == "split"
    (cache_dir / ("b" * 64) / build_cache.BUILD_RECORD).write_text("not json")
    assert build_cache.recorded_build_path(cache_dir, "b" * 64, split_asked=True) == "split"


def test_what_a_builder_reports_is_bounded_by_what_the_service_asked_and_measured() -> None:
    assert build_cache.reported_build_path("split", split_asked=False) == "whole"
    assert build_cache.reported_build_path("fallback", split_asked=False) == "whole"
    assert build_cache.reported_build_path("fallback", split_asked=True) == "fallback"
    for claim in ("whole", "split", None, 7, ["fallback"]):
        assert build_cache.reported_build_path(claim, split_asked=True) == "split"
    reported = {"split_device": 1.5, "split_host": 99.0, "split_link": -3, "whole": math.nan, "made_up": 1.0,
                "split_stub": "2", "split_binding": True}  # fmt: skip
    assert build_cache.reported_parts(reported, builder_s=10.0) == {
        "split_device": 1.5,
        "split_host": 10.0,
        "split_link": 0.0,
        "split_binding": 1.0,
    }
    assert build_cache.reported_parts(["split_device", 1.0], builder_s=10.0) == {}


def test_a_whole_rebuild_never_finds_the_split_library(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    pytest.importorskip("tree_sitter_cuda")
    from tests.evaluator import cuda_corpus

    case = next(c for c in cuda_corpus.cases() if c.name == "c01_relu_basic")
    (call,) = cuda_corpus.load_inline_calls(case.source)
    event = {"kind": "load_inline", "arguments": call}
    monkeypatch.setenv("EVALUATOR_SPLIT_BUILD", "1")
    kind, split = build_cache.parse_request(event, "cuda")
    _, whole = build_cache.parse_request(event, "cuda", allow_split=False)
    assert build_cache.SPLIT_ARGUMENT in split and build_cache.SPLIT_ARGUMENT not in whole
    split_key, whole_key = build_cache.cache_key(kind, split, "arch"), build_cache.cache_key(kind, whole, "arch")
    assert split_key != whole_key
    cache_dir, root = tmp_path / "cache", tmp_path / "builder"
    build_cache.prepare(cache_dir)
    (root / "home" / "build").mkdir(parents=True)
    name = f"{build_cache.library_name(split_key)}.so"
    (root / "home" / "build" / name).write_bytes(b"split library")
    build_cache.publish(cache_dir, root, None, split_key, [name], "split")
    assert build_cache.cached_library(cache_dir, split_key) is not None
    assert build_cache.cached_library(cache_dir, whole_key) is None


# Evaluations ------------------------------------------------------------------------------------------------------


def _evaluate(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, candidate: str, recorded: str, **fields: Any
) -> tuple[EvaluationResult, list[bool]]:
    """Evaluate on a real CPU evaluator whose judge, in each run it lets split, records `recorded` as the build
    path of one extension; the result and, per run of the judge, whether it was allowed to split."""
    real_run = Judge.run
    runs: list[bool] = []

    async def run_with_extension(judge: Judge) -> CandidateRun:
        runs.append(judge.allow_split)
        judge.run_state.build_paths.append(recorded if judge.allow_split else "whole")
        return await real_run(judge)

    monkeypatch.setattr(Judge, "run", run_with_extension)
    monkeypatch.setattr(evaluation.split_build, "enabled", lambda: True)
    settings = Settings(cache_dir=tmp_path / "cache", work_dir=tmp_path, workers=1, prespawn=False,
                        threads_per_worker=1, min_sample_ms=2)  # fmt: skip
    request = EvaluateRequest(reference_source=sources.REFERENCE, candidate_source=candidate, correctness_trials=2,
                              timing_trials=0, seed=1234, **fields)  # fmt: skip

    async def evaluate() -> EvaluationResult:
        pool = WorkerPool(settings, strict=False)
        try:
            return await Evaluator(settings, pool).evaluate(request)
        finally:
            await pool.close()

    return asyncio.run(evaluate()), runs


def test_a_split_built_failure_is_rebuilt_whole_once_and_the_whole_verdict_is_final(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    result, runs = _evaluate(tmp_path, monkeypatch, sources.WRONG_OUTPUT, "split", timeout_s=120)
    assert runs == [True, False]
    assert result.status is EvaluationStatus.incorrect, result.message
    assert result.build_path == "fallback"
    assert result.phases_s["split_run"] > 0 and "correctness" in result.phases_s


def test_a_correct_split_verdict_stands(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    result, runs = _evaluate(tmp_path, monkeypatch, sources.CORRECT, "split", timeout_s=120)
    assert runs == [True]
    assert result.status is EvaluationStatus.correct, result.message
    assert result.build_path == "split" and "split_run" not in result.phases_s


def test_a_failure_of_a_whole_build_is_not_run_again(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    result, runs = _evaluate(tmp_path, monkeypatch, sources.WRONG_OUTPUT, "fallback", timeout_s=120)
    assert runs == [True]
    assert result.status is EvaluationStatus.incorrect and result.build_path == "fallback"


def test_a_split_built_timeout_is_rebuilt_whole_with_the_whole_limit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    result, runs = _evaluate(tmp_path, monkeypatch, sources.INFINITE_LOOP, "split", timeout_s=15)
    assert runs == [True, False]  # the split run took all its time, and the whole run starts with all of its own
    assert result.status is EvaluationStatus.timeout, result.message
    assert result.build_path == "fallback" and not result.correct
    assert result.phases_s["split_run"] >= 15


def test_a_whole_run_that_hangs_after_a_quick_split_run_is_a_timeout(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Wrong at once in the first process that runs it; in any later one (the whole run) it hangs until the limit. The
    # two runs share a file the test makes in /dev/shm: a process-isolation job may write an existing file there, and
    # nothing outside its home it would make.
    marker = Path(tempfile.mkstemp(prefix="ka-first-pid-", dir="/dev/shm")[1])
    marker.chmod(0o666)
    candidate = sources.candidate(
        f"""
if not open({str(marker)!r}).read():
    with open({str(marker)!r}, "w") as handle:
        handle.write(str(os.getpid()))
while open({str(marker)!r}).read() != str(os.getpid()):
    pass
return x.clamp_min(0) * (self.scale + 1)
""",
        prelude="import os",
    )
    try:
        result, runs = _evaluate(tmp_path, monkeypatch, candidate, "split", timeout_s=40)
    finally:
        marker.unlink()
    assert runs == [True, False]
    assert result.status is EvaluationStatus.timeout, result.message  # the whole run's verdict, as with splits off
    assert result.build_path == "fallback" and result.phases_s["split_run"] > 0
