"""From what the judge saw of a run to a verdict: which facts decide, and that the candidate's events decide little."""

from __future__ import annotations

from services.evaluator.compare import Comparison
from services.evaluator.config import HACK_FLAGS
from services.evaluator.pool import WorkerOutcome
from services.evaluator.verdict import CandidateRun, TimingResult, candidate_result

EXITED = WorkerOutcome(returncode=0, timed_out=False, stdio_tail="")
KILLED = WorkerOutcome(returncode=-9, timed_out=False, stdio_tail="")
TIMING = TimingResult(
    reference_ms=[2.0, 2.0, 2.0], candidate_ms=[1.0, 1.0, 1.0], calls_per_sample=4, flags={}, device="cpu"
)


def verdict(**fields: object) -> dict[str, object]:
    run = CandidateRun(**fields)  # type: ignore[arg-type]
    return candidate_result(run, HACK_FLAGS, 4000).model_dump()


def test_correct_and_timed_gives_the_ratio_of_medians() -> None:
    result = verdict(outcome=EXITED, comparison=Comparison(True), compiled=True, timing_started=True, timing=TIMING)
    assert result["status"] == "correct" and result["speedup"] == 2.0
    assert result["candidate_ms"]["n"] == 3


def test_timing_that_never_finished_is_a_crash() -> None:
    result = verdict(outcome=KILLED, comparison=Comparison(True), compiled=True, timing_started=True)
    assert result["status"] == "crashed" and "while timing" in result["message"]
    assert result["speedup"] is None


def test_untimed_correct_run_has_no_speedup() -> None:
    result = verdict(outcome=EXITED, comparison=Comparison(True), compiled=True)
    assert result["status"] == "correct" and result["speedup"] is None


def test_a_flag_raised_by_the_judge_rejects_a_run_it_cut_short() -> None:
    flags = {"stale_output": "the output of timed call 3 of block 2 was wrong"}
    result = verdict(outcome=KILLED, comparison=Comparison(True), compiled=True, timing_started=True, flags=flags)
    assert result["status"] == "rejected" and "timed call 3" in result["message"]
    assert result["flags"] == ["stale_output"]


def test_a_timing_flag_rejects_and_an_advisory_one_does_not() -> None:
    lying = TimingResult([2.0], [0.01], 4, {"implausible_timing": "unexplained"}, "cpu")
    result = verdict(outcome=EXITED, comparison=Comparison(True), compiled=True, timing_started=True, timing=lying)
    assert result["status"] == "rejected" and result["speedup"] is None
    clocked = TimingResult([2.0], [1.0], 4, {"timed_by_judge": "judge's clock"}, "cpu")
    result = verdict(outcome=EXITED, comparison=Comparison(True), compiled=True, timing_started=True, timing=clocked)
    assert result["status"] == "correct" and result["speedup"] == 2.0 and result["flags"] == ["timed_by_judge"]


def test_comparison_past_the_deadline_is_a_timeout() -> None:
    result = verdict(outcome=KILLED, comparison=Comparison(False, "late", timed_out=True), compiled=True)
    assert result["status"] == "timeout"


def test_guard_report_and_input_mutation_reject() -> None:
    result = verdict(
        outcome=EXITED, comparison=Comparison(True, input_mutation=True), compiled=True, replaced={"torch.allclose"}
    )
    assert result["status"] == "rejected"
    assert result["flags"] == ["input_mutation", "monkeypatch"] and "torch.allclose" in result["message"]


def test_a_compile_error_event_before_compiling_is_a_compile_error() -> None:
    events = [{"event": "error", "stage": "compile", "message": "x.cpp:3: error: expected ';'"}]
    result = verdict(events=events, outcome=EXITED)
    assert result["status"] == "compile_error" and result["message"].startswith("compiler errors:")


def test_exit_before_any_output_is_a_crash_whatever_was_printed() -> None:
    events = [{"event": "outputs_written"}, {"event": "block", "nonce": "0", "ms": [0.001]}]
    result = verdict(events=events, outcome=EXITED, compiled=True)
    assert result["status"] == "crashed" and result["correct"] is False
