"""Turn what the judge saw of a candidate (exit, comparison, timed blocks, flags) into an EvaluationResult."""

from __future__ import annotations

import re
import statistics
from dataclasses import dataclass, field
from typing import Any

from services.evaluator.compare import Comparison
from services.evaluator.pool import WorkerOutcome
from shared.contracts import BuildPath, EvaluationResult, EvaluationStatus, TimingStats

# Verdicts a split-built library could have caused (it fails to load, computes wrong, faults, hangs): with a split
# build behind them they stand only once a whole build agrees (see needs_whole_rebuild). `rejected` is left out: its
# flags are what the judge saw the candidate do, and a second run would be a second draw at the judge's random
# checks. `evaluator_error` says nothing of the candidate.
SPLIT_SENSITIVE = frozenset(
    {
        EvaluationStatus.compile_error,
        EvaluationStatus.runtime_error,
        EvaluationStatus.incorrect,
        EvaluationStatus.timeout,
        EvaluationStatus.crashed,
    }
)


# What a message never carries as is: control characters other than tab and newline (C0, DEL, C1: ESC starts a
# terminal's escape sequences); lone surrogates (a worker's JSON can carry "\ud800", which no UTF-8 response can
# encode: the service answered 500 instead of the verdict); and the invisible characters that reorder or hide text
# (zero-width ones, line and paragraph separators, bidirectional embeddings, overrides and isolates, the BOM).
UNPRINTABLE = re.compile(
    r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u200b-\u200f\u2028-\u202e\u2060-\u206f\ufeff\ufff9-\ufffb\ud800-\udfff]"
)


def printable(text: str) -> str:
    """`text` with each character of UNPRINTABLE written as its escape (`\\x1b`, `\\u202e`): a message carries what
    a candidate printed or raised, and goes to terminals (the CLI), into JSON responses and into the next prompt."""
    return UNPRINTABLE.sub(lambda match: _escape(ord(match.group())), text)


def _escape(code: int) -> str:
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


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


def timing_stats(samples: list[float], calls_per_sample: int) -> TimingStats | None:
    if not samples:
        return None
    return TimingStats(
        median=statistics.median(samples),
        mean=statistics.fmean(samples),
        std=statistics.pstdev(samples),
        min=min(samples),
        max=max(samples),
        n=len(samples),
        calls_per_sample=calls_per_sample,
    )


@dataclass
class TimingResult:
    """What the judge made of the timed blocks: per-call milliseconds of each side, one sample per block."""

    reference_ms: list[float]
    candidate_ms: list[float]
    calls_per_sample: int
    flags: dict[str, str]
    device: str


@dataclass
class CandidateRun:
    """Everything the judge learned while a candidate worker ran; only `events` came from the candidate, and
    from them only whether it compiled and the text of its errors is taken."""

    events: list[dict[str, Any]] = field(default_factory=list)
    outcome: WorkerOutcome | None = None
    comparison: Comparison | None = None
    timing: TimingResult | None = None
    static_flags: list[str] = field(default_factory=list)
    # Flags the judge raised while running, with a note each.
    flags: dict[str, str] = field(default_factory=dict)
    # Names the candidate process's own guard reported replaced (a hint: that process can lie).
    replaced: set[str] = field(default_factory=set)
    # Seconds per phase on the judge's clock.
    phases: dict[str, float] = field(default_factory=dict)
    compiled: bool = False
    cache_hits: int = 0
    timing_started: bool = False
    # The build path of each library the candidate loaded or failed to build, by the service's record.
    build_paths: list[str] = field(default_factory=list)

    @property
    def build_path(self) -> BuildPath | None:
        """One split library makes the run split-built; else a fallback, if any; else whole; None without builds."""
        order: tuple[BuildPath, ...] = ("split", "fallback", "whole")
        return next((path for path in order if path in self.build_paths), None)

    def first(self, name: str) -> dict[str, Any] | None:
        return next((event for event in self.events if event.get("event") == name), None)

    def all_flags(self) -> tuple[list[str], str]:
        """Every flag the run raised, and a note explaining the dynamic ones."""
        flags, notes = list(self.static_flags), []
        if self.replaced:
            flags.append("monkeypatch")
            notes.append(f"replaced: {', '.join(sorted(self.replaced)[:20])}")
        if self.comparison is not None and self.comparison.input_mutation:
            flags.append("input_mutation")
            notes.append("the candidate changed its input tensors")
        if self.first("flood"):
            flags.append("result_tampering")
            notes.append("the worker's channel was flooded")
        judged = {**self.flags, **(self.timing.flags if self.timing else {})}
        flags += list(judged)
        notes += list(judged.values())
        return flags, "; ".join(notes)


def _failure(run: CandidateRun) -> tuple[EvaluationStatus, str] | None:
    """Status and message when the candidate did not get through correctness and timing cleanly."""
    error = run.first("error")
    stage = error.get("stage") if error else None
    message = str(error.get("message", "")) if error else ""
    outcome = run.outcome
    tail = outcome.stdio_tail if outcome else ""
    if stage == "compile" or (not run.compiled and stage is not None):
        return EvaluationStatus.compile_error, with_compiler_errors_first(message)
    if stage == "run":
        return EvaluationStatus.runtime_error, message
    if run.comparison is not None and run.comparison.timed_out:
        return EvaluationStatus.timeout, f"killed at the time limit while its outputs were compared\n{tail}"
    if run.comparison is not None and not run.comparison.correct:
        return EvaluationStatus.incorrect, run.comparison.message
    if outcome is not None and outcome.timed_out:
        where = "while timing" if run.comparison is not None else "before its outputs were written"
        return EvaluationStatus.timeout, f"killed at the time limit, {where}\n{tail}"
    if stage is not None:
        return EvaluationStatus.runtime_error, f"{message}\n(raised while {stage})"
    if run.flags or (run.timing and run.timing.flags):
        return None  # a flag ended the run early; it decides the verdict
    # Without compared outputs nothing was shown to be correct, whatever else the worker reported.
    timed_ok = run.timing is not None or not run.timing_started
    # A job the service killed (its memory, a resisted stop) fails even where its worker went on to answer.
    killed = outcome is not None and outcome.killed_for is not None
    if run.comparison is None or outcome is None or outcome.returncode != 0 or killed or not timed_ok:
        if run.comparison is not None:
            where = "while timing" if run.timing is None else "after timing"
        else:
            where = "while running" if run.compiled else "while importing/building ModelNew"
        if outcome is None:
            detail = "stopped answering"
        elif outcome.returncode != 0 or killed:
            detail = outcome.describe_exit()
        else:
            detail = "exited without a result"
        return EvaluationStatus.crashed, f"worker {detail} {where}\n{tail}"
    return None


def candidate_result(run: CandidateRun, reject: frozenset[str], message_chars: int) -> EvaluationResult:
    flags, note = run.all_flags()
    failure = _failure(run)
    status, message = failure if failure else (EvaluationStatus.correct, "")
    rejecting = [flag for flag in flags if flag in reject]
    # A rejecting flag wins over every other status: the status of a failure can come from a line the candidate
    # wrote itself (an `error` event), and a caught hack must not choose a milder one.
    if rejecting:
        status, message = EvaluationStatus.rejected, f"rejected for {', '.join(rejecting)}. {note}\n{message}"
    elif note:
        message = f"{message}\n{note}".strip()
    correct = status is EvaluationStatus.correct
    timing = run.timing if correct else None
    ref_ms = timing_stats(timing.reference_ms, timing.calls_per_sample) if timing else None
    cand_ms = timing_stats(timing.candidate_ms, timing.calls_per_sample) if timing else None
    speedup = ref_ms.median / cand_ms.median if ref_ms and cand_ms and cand_ms.median > 0 else None
    comparison = run.comparison
    return EvaluationResult(
        status=status,
        compiled=run.compiled,
        correct=correct,
        speedup=speedup,
        reference_ms=ref_ms,
        candidate_ms=cand_ms,
        max_abs_error=comparison.max_abs_error if comparison else None,
        max_rel_error=comparison.max_rel_error if comparison else None,
        flags=sorted(set(flags)),
        message=truncate(printable(message), message_chars),
        device=timing.device if timing else "",
        cache_hit=run.cache_hits > 0,
        build_path=run.build_path,
    )


def needs_whole_rebuild(result: EvaluationResult) -> bool:
    """Whether a verdict must be checked by evaluating the candidate again with every extension built whole: the
    split build may only save time, never change a verdict."""
    return result.build_path == "split" and result.status in SPLIT_SENSITIVE
