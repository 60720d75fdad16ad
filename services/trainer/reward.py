"""The reward: one function of the evaluator's verdict (None means "no verdict on the candidate", left out of the loss)."""

from __future__ import annotations

from dataclasses import dataclass

from shared.contracts import EvaluationResult, EvaluationStatus


@dataclass(frozen=True)
class RewardValues:
    not_compiled: float = -1.0
    incorrect: float = -0.5
    correct_bonus: float = 0.3
    speedup_cap: float | None = None


def reward(result: EvaluationResult, baseline_ms: float | None, values: RewardValues) -> float | None:
    """-1 not compiled, -0.5 compiled but wrong, 0.3 + baseline_ms / candidate_ms when correct.

    `baseline_ms` is the evaluator's reference timing of the problem on that device. None is returned for an
    `evaluator_error` (the evaluator failed, not the candidate) and for a correct verdict without timings.
    """
    if result.status is EvaluationStatus.evaluator_error:
        return None
    if not result.compiled or result.status in (EvaluationStatus.compile_error, EvaluationStatus.rejected):
        return values.not_compiled
    if result.status is not EvaluationStatus.correct:
        return values.incorrect
    if baseline_ms is None or result.candidate_ms is None or result.candidate_ms.median <= 0:
        return None
    speedup = baseline_ms / result.candidate_ms.median
    if values.speedup_cap is not None:
        speedup = min(speedup, values.speedup_cap)
    return values.correct_bonus + speedup
