"""Turn what a candidate worker reported (events, exit, comparison) into an EvaluationResult."""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Any

from services.evaluator.compare import Comparison
from services.evaluator.pool import WorkerOutcome
from shared.contracts import EvaluationResult, EvaluationStatus, TimingStats

# Slack for timer granularity and event delivery when checking reported timings against elapsed time.
TIMING_SLACK_S = 0.25


def truncate(text: str, limit: int) -> str:
    """Keep the head (first compiler errors) and the longer tail (end of a traceback) of `text`."""
    text = text.strip()
    if len(text) <= limit:
        return text
    head = limit // 3
    tail = limit - head - 40
    return f"{text[:head]}\n... [{len(text) - head - tail} characters cut] ...\n{text[-tail:]}"


def with_compiler_errors_first(message: str, most: int = 20) -> str:
    """Put the compiler's `error:` lines before the (long) build log, so truncation never hides them."""
    errors = [line.strip() for line in message.splitlines() if "error:" in line or "error " in line.lower()[:12]]
    if not errors:
        return message
    return "compiler errors:\n" + "\n".join(errors[:most]) + "\n\nfull output:\n" + message


def timing_stats(samples: list[float]) -> TimingStats | None:
    if not samples:
        return None
    return TimingStats(
        median=statistics.median(samples),
        mean=statistics.fmean(samples),
        std=statistics.pstdev(samples),
        min=min(samples),
        max=max(samples),
        n=len(samples),
    )


@dataclass
class CandidateRun:
    """Everything the service learned while a candidate worker ran."""

    events: list[dict[str, Any]]
    outcome: WorkerOutcome
    comparison: Comparison | None = None
    timed: bool = False
    go_sent_at: float | None = None
    static_flags: list[str] = field(default_factory=list)
    startup_s: float | None = None  # a ready worker taken and the inputs handed over
    job_sent_at: float | None = None
    compare_s: float | None = None

    def first(self, name: str) -> dict[str, Any] | None:
        return next((event for event in self.events if event.get("event") == name), None)

    def phases(self) -> dict[str, float]:
        """Seconds spent per phase, on the service's clock (events carry the time they arrived): where a slow
        evaluation spent its time. `device_wait` is the part of correctness and timing spent waiting for the GPU.
        Each phase ends at the first matching event after it began: candidate code can print forged events early."""
        phases: dict[str, float] = {}
        if self.startup_s is not None:
            phases["startup"] = self.startup_s
        built_at = self._first_after({"compiled", "error"}, self.job_sent_at)
        if self.job_sent_at is not None and built_at is not None:
            phases["build"] = built_at - self.job_sent_at
        written_at = self._first_after({"outputs_written", "error"}, built_at)
        if self.first("compiled") and built_at is not None and written_at is not None:
            phases["correctness"] = written_at - built_at
        if self.compare_s is not None:
            phases["compare"] = self.compare_s
        timed_at = self._first_after({"result", "error"}, self.go_sent_at)
        if self.timed and self.go_sent_at is not None and timed_at is not None:
            phases["timing"] = timed_at - self.go_sent_at
        waits = [e.get("wait_s") for e in self.events if e.get("event") == "device_acquired"]
        if waits:
            phases["device_wait"] = sum(max(0.0, w) for w in waits if isinstance(w, int | float))
        return phases

    def _first_after(self, names: set[str], start: float | None) -> float | None:
        if start is None:
            return None
        arrivals = (e.get("received_at") for e in self.events if e.get("event") in names)
        return next((float(t) for t in arrivals if isinstance(t, int | float) and t >= start), None)

    def flags(self) -> tuple[list[str], str]:
        """Hack flags the run raised, and a note explaining the dynamic ones."""
        flags, notes = list(self.static_flags), []
        replaced = sorted({name for e in self.events for name in e.get("replaced", []) if isinstance(name, str)})
        if replaced:
            flags.append("monkeypatch")
            notes.append(f"replaced: {', '.join(replaced[:20])}")
        if self.comparison is not None and self.comparison.input_mutation:
            flags.append("input_mutation")
            notes.append("the candidate changed its input tensors")
        if sum(e.get("event") == "result" for e in self.events) > 1 or self.first("flood"):
            flags.append("result_tampering")
            notes.append("the worker's result channel carried more than one result")
        gpu_flags = sorted({f for e in self.events for f in e.get("gpu_flags", []) if isinstance(f, str)})
        if gpu_flags:
            flags += gpu_flags
            notes += [str(n) for e in self.events for n in e.get("gpu_notes", [])]
        if self._implausible_timing():
            flags.append("implausible_timing")
            notes.append("reported timings exceed the time that elapsed")
        return flags, "; ".join(notes)

    def _implausible_timing(self) -> bool:
        result = self.first("result")
        if not self.timed or result is None or self.go_sent_at is None:
            return False
        try:
            measured_ms = (
                sum(result["reference_samples"]) * result["reference_reps"]
                + sum(result["candidate_samples"]) * result["candidate_reps"]
            )
            return measured_ms / 1e3 > result["received_at"] - self.go_sent_at + TIMING_SLACK_S
        except (KeyError, TypeError):
            return True


def _failure(run: CandidateRun) -> tuple[EvaluationStatus, str] | None:
    """Status and message when the candidate did not get through correctness and timing cleanly."""
    error = run.first("error")
    stage = error.get("stage") if error else None
    message = str(error.get("message", "")) if error else ""
    if stage == "compile":
        return EvaluationStatus.compile_error, with_compiler_errors_first(message)
    if stage == "run":
        return EvaluationStatus.runtime_error, message
    if run.comparison is not None and not run.comparison.correct:
        return EvaluationStatus.incorrect, run.comparison.message
    if run.outcome.timed_out:
        where = "while timing" if run.comparison is not None else "before its outputs were written"
        return EvaluationStatus.timeout, f"killed at the time limit, {where}\n{run.outcome.stdio_tail}"
    if stage is not None:
        return EvaluationStatus.runtime_error, f"{message}\n(raised while {stage})"
    # Without compared outputs nothing was shown to be correct, whatever else the worker reported.
    if run.comparison is None or run.outcome.returncode != 0 or run.first("result") is None:
        if run.comparison is not None:
            where = "after writing its outputs"
        else:
            where = "while running" if run.first("compiled") else "while importing/building ModelNew"
        detail = run.outcome.describe_exit() if run.outcome.returncode != 0 else "exited without a result"
        return EvaluationStatus.crashed, f"worker {detail} {where}\n{run.outcome.stdio_tail}"
    return None


def candidate_result(run: CandidateRun, reject: frozenset[str], message_chars: int) -> EvaluationResult:
    flags, note = run.flags()
    failure = _failure(run)
    compiled = run.first("compiled")
    result = run.first("result") or {}
    status, message = failure if failure else (EvaluationStatus.correct, "")
    rejecting = [flag for flag in flags if flag in reject]
    if rejecting and status in (EvaluationStatus.correct, EvaluationStatus.incorrect):
        status, message = EvaluationStatus.rejected, f"rejected for {', '.join(rejecting)}. {note}\n{message}"
    elif note:
        message = f"{message}\n{note}".strip()
    correct = status is EvaluationStatus.correct
    ref_ms = timing_stats(result.get("reference_samples", [])) if correct else None
    cand_ms = timing_stats(result.get("candidate_samples", [])) if correct else None
    speedup = ref_ms.median / cand_ms.median if ref_ms and cand_ms and cand_ms.median > 0 else None
    comparison = run.comparison
    return EvaluationResult(
        status=status,
        compiled=compiled is not None,
        correct=correct,
        speedup=speedup,
        reference_ms=ref_ms,
        candidate_ms=cand_ms,
        max_abs_error=comparison.max_abs_error if comparison else None,
        max_rel_error=comparison.max_rel_error if comparison else None,
        flags=sorted(set(flags)),
        message=truncate(message, message_chars),
        device=str(result.get("device", "")),
        cache_hit=bool(compiled and compiled.get("cache_hit")),
    )
