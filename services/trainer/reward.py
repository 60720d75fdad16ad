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


def reward(result: EvaluationResult, values: RewardValues) -> float | None:
    """-1 not compiled, -0.5 compiled but wrong, 0.3 + baseline_time / new_time when correct.

    baseline_time / new_time is the evaluator's `speedup`: the reference and the candidate timed against each other
    in the same evaluation, in alternating blocks on the same inputs, so load on the machine moves both alike, and
    what the judge could not verify is already capped there (`unverified_timing`). None is returned for an
    `evaluator_error` (the evaluator failed, not the candidate) and for a correct verdict without a speedup.
    """
    if result.status is EvaluationStatus.evaluator_error:
        return None
    if not result.compiled or result.status in (EvaluationStatus.compile_error, EvaluationStatus.rejected):
        return values.not_compiled
    if result.status is not EvaluationStatus.correct:
        return values.incorrect
    if result.speedup is None or result.speedup <= 0:
        return None
    speedup = result.speedup
    if values.speedup_cap is not None:
        speedup = min(speedup, values.speedup_cap)
    return values.correct_bonus + speedup
