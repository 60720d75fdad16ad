"""Trusted comparison of candidate outputs with reference outputs, in the service process.

Outputs arrive as files a worker wrote; they are read as data only (`torch.load(weights_only=True)`).
"""

from __future__ import annotations

import io
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from services.evaluator.sandbox import read_regular_file

# Default tolerances by reference dtype (absolute and relative alike).
TOLERANCES = {torch.float16: 1e-2, torch.bfloat16: 1e-2, torch.float32: 1e-4, torch.float64: 1e-4}
LOW_PRECISION_TOLERANCE = 1e-1


@dataclass
class Comparison:
    correct: bool
    message: str = ""
    max_abs_error: float | None = None
    max_rel_error: float | None = None
    input_mutation: bool = False


def load_data(data: bytes) -> Any:
    return torch.load(io.BytesIO(data), weights_only=True, map_location="cpu")


def flatten(value: Any) -> list[Any]:
    if isinstance(value, list | tuple):
        return [leaf for item in value for leaf in flatten(item)]
    if isinstance(value, bool | int | float):
        return [torch.tensor(value)]
    return [value]


def default_tolerance(dtype: torch.dtype) -> float:
    if dtype in TOLERANCES:
        return TOLERANCES[dtype]
    return LOW_PRECISION_TOLERANCE if dtype.is_floating_point else 0.0


def _compare_tensor(
    index: int,
    expected: torch.Tensor,
    actual: Any,
    atol: float | None,
    rtol: float | None,
    errors: list[tuple[float, float]],
) -> str:
    """Reason output `index` is wrong, or empty; appends its (max abs, max rel) error to `errors`."""
    if not isinstance(actual, torch.Tensor):
        return f"output {index} is a {type(actual).__name__}, expected a tensor"
    if actual.shape != expected.shape:
        return f"output {index} has shape {tuple(actual.shape)}, expected {tuple(expected.shape)}"
    if actual.dtype != expected.dtype:
        return f"output {index} has dtype {actual.dtype}, expected {expected.dtype}"
    if not expected.dtype.is_floating_point and not expected.is_complex():
        return (
            ""
            if torch.equal(actual, expected)
            else f"output {index} differs (exact match required for {expected.dtype})"
        )
    tol = default_tolerance(expected.dtype)
    atol, rtol = atol if atol is not None else tol, rtol if rtol is not None else tol
    want, got = expected.double(), actual.double()
    if bool((~torch.isfinite(got) & torch.isfinite(want)).any()):
        return f"output {index} has NaN/Inf where the reference is finite"
    finite = torch.isfinite(want) & torch.isfinite(got)
    diff = (got - want).abs()[finite]
    if diff.numel():
        errors.append((float(diff.max()), float((diff / (want.abs()[finite] + atol)).max())))
    if not bool(torch.isclose(got, want, rtol=rtol, atol=atol, equal_nan=True).all()):
        return f"output {index} differs beyond atol={atol:g} rtol={rtol:g}"
    return ""


def _same(before: Any, after: Any) -> bool:
    if isinstance(before, torch.Tensor):
        return (
            isinstance(after, torch.Tensor)
            and before.shape == after.shape
            and before.dtype == after.dtype
            and bool(torch.equal(torch.nan_to_num(before), torch.nan_to_num(after)))
        )
    return before == after


def compare_trial(
    expected: Any,
    inputs: list[Any],
    produced: Any,
    atol: float | None,
    rtol: float | None,
    errors: list[tuple[float, float]],
) -> tuple[str, bool]:
    """(reason the outputs are wrong or "", whether the candidate changed its inputs)."""
    if not isinstance(produced, dict) or "outputs" not in produced:
        return "output file is malformed", False
    after = produced.get("inputs_after") or []
    mutated = len(after) != len(inputs) or not all(_same(a, b) for a, b in zip(inputs, after, strict=False))
    want, got = flatten(expected), flatten(produced["outputs"])
    if len(want) != len(got):
        return f"returned {len(got)} outputs, expected {len(want)}", mutated
    for index, (w, g) in enumerate(zip(want, got, strict=True)):
        reason = _compare_tensor(index, w, g, atol, rtol, errors)
        if reason:
            return reason, mutated
    return "", mutated


def compare_outputs(
    out_dir: Path, expected: list[Any], inputs: list[list[Any]], atol: float | None, rtol: float | None, max_bytes: int
) -> Comparison:
    """Compare every trial's output file in `out_dir` with the reference; stops at the first wrong trial."""
    all_errors: list[tuple[float, float]] = []
    mutated = False
    for trial, (want, trial_inputs) in enumerate(zip(expected, inputs, strict=True)):
        try:
            produced = load_data(read_regular_file(out_dir / f"{trial}.pt", max_bytes))
        except Exception as exc:
            return Comparison(False, f"trial {trial}: unreadable output ({type(exc).__name__}: {exc})"[:500])
        reason, trial_mutated = compare_trial(want, trial_inputs, produced, atol, rtol, all_errors)
        mutated = mutated or trial_mutated
        if reason:
            return Comparison(False, f"trial {trial}: {reason}", *_maxima(all_errors), input_mutation=mutated)
    return Comparison(True, "", *_maxima(all_errors), input_mutation=mutated)


def _maxima(errors: list[tuple[float, float]]) -> tuple[float | None, float | None]:
    if not errors:
        return None, None
    return max(e[0] for e in errors), max(e[1] for e in errors)
