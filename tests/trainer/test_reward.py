"""The reward as a function of the verdict."""

from __future__ import annotations

import pytest

from services.trainer.reward import RewardValues, reward
from shared.contracts import EvaluationResult, EvaluationStatus, TimingStats

VALUES = RewardValues()


def _timing(ms: float) -> TimingStats:
    return TimingStats(median=ms, mean=ms, std=0.0, min=ms, max=ms, n=10)


def _result(status: str, compiled: bool = True, candidate_ms: float | None = None) -> EvaluationResult:
    return EvaluationResult(
        status=EvaluationStatus(status),
        compiled=compiled,
        correct=status == "correct",
        candidate_ms=_timing(candidate_ms) if candidate_ms else None,
    )


@pytest.mark.parametrize(
    ("status", "compiled", "expected"),
    [
        ("compile_error", False, -1.0),
        ("rejected", True, -1.0),
        ("incorrect", True, -0.5),
        ("runtime_error", True, -0.5),
        ("timeout", True, -0.5),
        ("crashed", True, -0.5),
    ],
)
def test_failures(status, compiled, expected):
    assert reward(_result(status, compiled), 2.0, VALUES) == expected


def test_correct_uses_the_cached_baseline_and_the_cap():
    assert reward(_result("correct", candidate_ms=0.5), 2.0, VALUES) == pytest.approx(0.3 + 4.0)
    capped = RewardValues(speedup_cap=3.0)
    assert reward(_result("correct", candidate_ms=0.5), 2.0, capped) == pytest.approx(3.3)


def test_evaluator_error_and_missing_timing_are_no_reward():
    assert reward(_result("evaluator_error", compiled=False), 2.0, VALUES) is None
    assert reward(_result("correct"), 2.0, VALUES) is None
    assert reward(_result("correct", candidate_ms=1.0), None, VALUES) is None
