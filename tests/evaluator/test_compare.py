"""Trusted output comparison (service side) on data as workers write it."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from services.evaluator.compare import compare_outputs, default_tolerance
from services.evaluator.verdict import truncate


def write_trial(out_dir: Path, trial: int, outputs: object, inputs_after: list[object]) -> None:
    out_dir.mkdir(exist_ok=True)
    torch.save({"outputs": outputs, "inputs_after": inputs_after}, out_dir / f"{trial}.pt")


def compare(
    tmp_path: Path,
    expected: object,
    produced: object,
    inputs: list[object] | None = None,
    after: list[object] | None = None,
    **tolerances: float,
):
    inputs = inputs if inputs is not None else [torch.ones(3)]
    write_trial(tmp_path / "out", 0, produced, after if after is not None else inputs)
    return compare_outputs(
        tmp_path / "out", [expected], [inputs], tolerances.get("atol"), tolerances.get("rtol"), 1 << 20
    )


def test_close_outputs_are_correct_with_errors_reported(tmp_path: Path) -> None:
    expected = torch.tensor([1.0, 2.0, 4.0])
    result = compare(tmp_path, expected, expected + 1e-6)
    assert result.correct and result.max_abs_error == pytest.approx(1e-6, rel=0.1)
    assert result.max_rel_error is not None and result.max_rel_error < 1e-6


@pytest.mark.parametrize(
    ("produced", "reason"),
    [
        (torch.tensor([1.0, 2.0, 4.1]), "differs"),
        (torch.tensor([1.0, 2.0]), "shape"),
        (torch.tensor([1.0, 2.0, 4.0], dtype=torch.float64), "dtype"),
        (torch.tensor([1.0, float("nan"), 4.0]), "NaN"),
        (torch.tensor([1.0, float("inf"), 4.0]), "NaN/Inf"),
        ([torch.tensor([1.0, 2.0, 4.0])] * 2, "outputs"),
        ("not a tensor", "expected a tensor"),
    ],
)
def test_wrong_outputs_are_incorrect(tmp_path: Path, produced: object, reason: str) -> None:
    result = compare(tmp_path, torch.tensor([1.0, 2.0, 4.0]), produced)
    assert not result.correct and reason in result.message


def test_tolerances_follow_dtype_and_request(tmp_path: Path) -> None:
    assert default_tolerance(torch.float32) == 1e-4 and default_tolerance(torch.bfloat16) == 1e-2
    half = torch.tensor([1.0, 2.0], dtype=torch.float16)
    assert compare(tmp_path, half, half + 0.005).correct
    assert not compare(tmp_path, torch.tensor([1.0]), torch.tensor([1.001])).correct
    assert compare(tmp_path, torch.tensor([1.0]), torch.tensor([1.001]), atol=1e-2).correct


def test_matching_nan_positions_are_equal(tmp_path: Path) -> None:
    expected = torch.tensor([float("nan"), 1.0])
    assert compare(tmp_path, expected, expected.clone()).correct


def test_input_mutation_is_detected(tmp_path: Path) -> None:
    inputs = [torch.ones(3), 5]
    assert not compare(tmp_path, torch.ones(1), torch.ones(1), inputs, [torch.ones(3), 5]).input_mutation
    assert compare(tmp_path, torch.ones(1), torch.ones(1), inputs, [torch.zeros(3), 5]).input_mutation


def test_symlinked_output_is_refused(tmp_path: Path) -> None:
    (tmp_path / "out").mkdir()
    torch.save({"outputs": torch.ones(1), "inputs_after": []}, tmp_path / "real.pt")
    (tmp_path / "out" / "0.pt").symlink_to(tmp_path / "real.pt")
    result = compare_outputs(tmp_path / "out", [torch.ones(1)], [[]], None, None, 1 << 20)
    assert not result.correct and "unreadable" in result.message


def test_truncate_keeps_head_and_tail() -> None:
    text = "HEAD" + "x" * 10_000 + "TAIL"
    short = truncate(text, 1000)
    assert len(short) <= 1000 and short.startswith("HEAD") and short.endswith("TAIL") and "cut" in short
