"""The reward as a function of the verdict."""

from __future__ import annotations

import pytest

from services.trainer.reward import RewardValues, reward
from shared.contracts import EvaluationResult, EvaluationStatus, TimingStats

VALUES = RewardValues()


def _timing(ms: float) -> TimingStats:
    return TimingStats(median=ms, mean=ms, std=0.0, min=ms, max=ms, n=10)


def _result(status: str, compiled: bool = True, speedup: float | None = None) -> EvaluationResult:
    return EvaluationResult(
        status=EvaluationStatus(status),
        compiled=compiled,
        correct=status == "correct",
        reference_ms=_timing(2.0) if speedup else None,
        candidate_ms=_timing(2.0 / speedup) if speedup else None,
        speedup=speedup,
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
    assert reward(_result(status, compiled), VALUES) == expected


def test_correct_is_the_bonus_plus_the_evaluations_own_speedup_and_the_cap():
    assert reward(_result("correct", speedup=4.0), VALUES) == pytest.approx(0.3 + 4.0)
    capped = RewardValues(speedup_cap=3.0)
    assert reward(_result("correct", speedup=4.0), capped) == pytest.approx(3.3)


def test_the_speedup_comes_from_the_verdict_not_from_raw_times():
    """The judge's speedup is what it verified: capped at 1 under `unverified_timing` even where the candidate's
    reported times alone would say more."""
    unverified = _result("correct", speedup=1.0).model_copy(update={"candidate_ms": _timing(0.1)})
    assert reward(unverified, VALUES) == pytest.approx(1.3)


def test_evaluator_error_and_missing_timing_are_no_reward():
    assert reward(_result("evaluator_error", compiled=False), VALUES) is None
    assert reward(_result("correct"), VALUES) is None
