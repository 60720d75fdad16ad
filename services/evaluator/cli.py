"""Command-line client of the evaluator service: score one candidate, or a folder of them KernelBench-style.

    kernel-agent score --reference ref.py --candidate new.py [--timeout S] [--json]
    kernel-agent batch --kernelbench PATH --level 1 --candidates DIR [--all] [--out results.jsonl]
    kernel-agent problems [--kernelbench PATH --level 1 | --problems builtin]

(`python -m services.evaluator.cli ...` is the same command.)

It talks to a running evaluator over HTTP only (EVALUATOR_URL, default http://127.0.0.1:8001; EVALUATOR_TOKEN).
In `batch`, DIR holds one file per problem, named after the problem file: `19_ReLU.py` or `level1_19_ReLU.py`
(built-in problems: `softmax_primitives.py`). `batch` reports the problems that have a candidate and states fast_p
over them; with `--all` every selected problem is listed and a problem without a candidate counts as failed.
Exit status: `score` 0 when the candidate is correct, 1 when not; `batch` 0; both 2 on usage or service errors.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from pydantic import ValidationError

from problems import KernelBenchUnavailable, Problem, load_kernelbench, load_problems
from shared.clients import AsyncEvaluatorClient, EvaluatorClient, ServiceError
from shared.contracts import MAX_SOURCE_BYTES, EvaluateRequest, EvaluationResult, EvaluationStatus, TimingStats

DEFAULT_URL = "http://127.0.0.1:8001"
FAST_P_THRESHOLDS = (0.0, 1.0, 1.5, 2.0)
START_HINT = "start it with `make serve-evaluator` (python -m services.evaluator --host 127.0.0.1 --port 8001)"


class CliError(Exception):
    """A problem the user can fix; printed without a traceback, exit status 2."""


# ---- scoring math (pure) ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Outcome:
    """What fast_p needs from one problem: was its candidate correct, and how much faster."""

    correct: bool
    speedup: float | None


def fast_p(outcomes: Sequence[Outcome], p: float) -> float:
    """KernelBench fast_p: the fraction of the given problems whose candidate is correct and has speedup > p.

    fast_0 is the correctness rate: a correct candidate without timing counts for p = 0 only.
    """
    if not outcomes:
        return 0.0
    hits = sum(1 for o in outcomes if o.correct and (p <= 0 or (o.speedup is not None and o.speedup > p)))
    return hits / len(outcomes)


def geomean_speedup(outcomes: Sequence[Outcome]) -> float | None:
    """Geometric mean of the speedups of correct, timed candidates; None when there are none."""
    speedups = [o.speedup for o in outcomes if o.correct and o.speedup is not None and o.speedup > 0]
    if not speedups:
        return None
    return math.exp(sum(math.log(s) for s in speedups) / len(speedups))


# ---- text output ---------------------------------------------------------------------------------------------------


def format_table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """A plain left-aligned text table."""
    widths = [max(len(str(cell)) for cell in column) for column in zip(headers, *rows, strict=True)]
    lines = [
        "  ".join(str(cell).ljust(w) for cell, w in zip(line, widths, strict=True)).rstrip()
        for line in (headers, ["-" * w for w in widths], *rows)
    ]
    return "\n".join(lines)


def _num(value: float | None, fmt: str = ".3f") -> str:
    return "-" if value is None else format(value, fmt)


def _ms(stats: TimingStats | None) -> str:
    return "-" if stats is None else f"{stats.median:.3f} (n={stats.n}, min {stats.min:.3f}, std {stats.std:.3f})"


def verdict_table(result: EvaluationResult) -> str:
    rows = [
        ("status", result.status.value),
        ("compiled", str(result.compiled).lower()),
        ("correct", str(result.correct).lower()),
        ("speedup", "-" if result.speedup is None else f"{result.speedup:.3f}x"),
        ("reference ms", _ms(result.reference_ms)),
        ("candidate ms", _ms(result.candidate_ms)),
        ("max abs error", _num(result.max_abs_error, ".3g")),
        ("max rel error", _num(result.max_rel_error, ".3g")),
        ("flags", ", ".join(result.flags) or "-"),
        ("cache hit", str(result.cache_hit).lower()),
        ("build path", result.build_path or "-"),
        ("device", result.device or "-"),
        ("torch", result.torch_version or "-"),
        ("seed", "-" if result.seed is None else str(result.seed)),
        ("duration s", f"{result.duration_s:.2f}"),
    ]
    text = format_table(("field", "value"), rows)
    return f"{text}\nmessage:\n{result.message.rstrip()}" if result.message.strip() else text


# ---- shared plumbing -----------------------------------------------------------------------------------------------


def read_source(path: Path, what: str) -> str:
    if not path.is_file():
        raise CliError(f"{what} file not found: {path}")
    try:
        source = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise CliError(f"cannot read {what} file {path}: {exc}") from exc
    if len(source.encode("utf-8")) > MAX_SOURCE_BYTES:
        raise CliError(f"{what} file {path} is larger than the evaluator's limit of {MAX_SOURCE_BYTES} bytes")
    return source


def service_error(exc: ServiceError, url: str, token: str | None) -> CliError:
    if exc.status_code is None:
        return CliError(f"cannot reach the evaluator at {url}: {START_HINT}, or pass --url / set EVALUATOR_URL")
    if exc.status_code in (401, 403):
        fix = "check --token / EVALUATOR_TOKEN" if token else "pass --token or set EVALUATOR_TOKEN"
        return CliError(f"the evaluator at {url} refused the bearer token (HTTP {exc.status_code}): {fix}")
    return CliError(f"the evaluator refused the request (HTTP {exc.status_code}): {exc.detail}")


def check_reachable(url: str, token: str | None) -> None:
    """Fail fast, with the command that starts the service, when nothing answers at `url`."""
    try:
        with EvaluatorClient(url, token=token, timeout_s=10.0, retries=1) as client:
            client.health()
    except ServiceError as exc:
        raise service_error(exc, url, token) from exc


def make_request(args: argparse.Namespace, reference: str, candidate: str) -> EvaluateRequest:
    try:
        return EvaluateRequest(
            reference_source=reference,
            candidate_source=candidate,
            device=args.device,
            timing_trials=args.timing_trials,
            correctness_trials=args.correctness_trials,
            timeout_s=args.timeout,
        )
    except ValidationError as exc:
        reasons = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())
        raise CliError(f"invalid request: {reasons}") from exc


def http_timeout(args: argparse.Namespace) -> float:
    """The HTTP wait: twice the evaluation's own limit (a split-built run that failed is run again whole, with a
    limit of its own) plus room for the queue, or the client's default."""
    return 600.0 if args.timeout is None else 2 * args.timeout + 120.0


# ---- score ---------------------------------------------------------------------------------------------------------


def run_score(args: argparse.Namespace) -> int:
    request = make_request(args, read_source(args.reference, "reference"), read_source(args.candidate, "candidate"))
    check_reachable(args.url, args.token)
    try:
        with EvaluatorClient(args.url, token=args.token, timeout_s=http_timeout(args)) as client:
            result = client.evaluate(request)
    except ServiceError as exc:
        raise service_error(exc, args.url, args.token) from exc
    print(result.model_dump_json(indent=2) if args.json else verdict_table(result))
    return 0 if result.correct else 1


# ---- batch ---------------------------------------------------------------------------------------------------------


@dataclass
class BatchRow:
    problem: Problem
    candidate: Path | None
    result: EvaluationResult | None = None
    error: str = ""

    @property
    def outcome(self) -> Outcome:
        ok = self.result is not None and self.result.correct
        return Outcome(correct=ok, speedup=self.result.speedup if ok and self.result else None)

    @property
    def note(self) -> str:
        """The cause from the error, a failed verdict's message (a traceback's last line, not its first) or why a
        correct one has no speedup (`not_timed`), cut to NOTE_CHARS of it; the fix for a known cause is kept whole
        after it."""
        explained = self.result is not None and (not self.result.correct or self.result.speedup is None)
        text = self.error or (self.result.message if self.result and explained else "")
        return message_cause(text, NOTE_CHARS)

    @property
    def status(self) -> str:
        if self.candidate is None:
            return "missing"
        return self.result.status.value if self.result else "error"


TRACEBACK = "Traceback (most recent call last):"
NOTE_CHARS = 100
MEMORY_FIX = "raise the evaluator's memory limit (EVALUATOR_MEMORY_LIMIT_MB) or use a larger GPU"
HINTS = (
    ("out of memory", MEMORY_FIX),
    ("can't allocate memory", MEMORY_FIX),  # torch's CPU allocator (a KernelBench problem at its size on a CPU)
    ("Cannot allocate memory", MEMORY_FIX),
    ("File too large", "raise EVALUATOR_MAX_FILE_MB"),
    ("No space left", "give the evaluator's temporary directory more room (the compose tmpfs size)"),
    ("not timed:", "raise --timeout or lower --timing-trials"),
)


def message_cause(text: str, cause_chars: int | None = None) -> str:
    """One line: the message's lead and, for a traceback, its exception line (its first `cause_chars`); plus a fix
    for known causes."""
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    if not lines:
        return ""
    lead = lines[0]
    if TRACEBACK in lead or any(line.startswith(TRACEBACK) for line in lines[1:]):
        lead = lead.split(TRACEBACK)[0].strip()
        cause = lines[-1]
        lead = f"{lead} {cause}" if lead else cause
    lead = lead[:cause_chars]
    hint = next((fix for needle, fix in HINTS if needle.lower() in text.lower()), None)
    return f"{lead} (fix: {hint})" if hint else lead


def candidate_names(problem: Problem) -> tuple[str, ...]:
    """File names a candidate for `problem` may have, in order of preference."""
    names = [f"{problem.name}.py"]
    if problem.level.startswith("level"):
        names.insert(0, f"{problem.level}_{problem.name}.py")
    return tuple(names)


def match_candidates(problems: Sequence[Problem], folder: Path) -> tuple[list[BatchRow], list[Path]]:
    """Pair every problem with its candidate file in `folder`; also return the files that match no problem."""
    if not folder.is_dir():
        raise CliError(f"candidates folder not found: {folder}")
    rows, used = [], set()
    for problem in problems:
        found = next((folder / n for n in candidate_names(problem) if (folder / n).is_file()), None)
        rows.append(BatchRow(problem, found))
        used.add(found)
    unmatched = sorted(f for f in folder.glob("*.py") if f not in used)
    return rows, unmatched


def select_problems(args: argparse.Namespace) -> list[Problem]:
    try:
        if args.problems:
            return load_problems(args.problems)
        return load_kernelbench(args.kernelbench, levels=args.level)
    except (KernelBenchUnavailable, ValueError, KeyError) as exc:
        raise CliError(str(exc)) from exc


async def _score_row(
    client: AsyncEvaluatorClient, gate: asyncio.Semaphore, args: argparse.Namespace, row: BatchRow
) -> BatchRow:
    try:
        request = make_request(args, row.problem.source, read_source(row.candidate, "candidate"))  # type: ignore[arg-type]
        async with gate:
            row.result = await client.evaluate(request)
    except CliError as exc:
        row.error = str(exc)
    except ServiceError as exc:
        row.error = str(service_error(exc, args.url, args.token))
    return row


async def score_rows(rows: list[BatchRow], args: argparse.Namespace) -> None:
    """Score every row that has a candidate, `args.concurrency` at a time, with progress on stderr."""
    todo = [row for row in rows if row.candidate is not None]
    gate = asyncio.Semaphore(args.concurrency)
    print(f"scoring {len(todo)} candidate(s) at {args.url}, {args.concurrency} at a time", file=sys.stderr, flush=True)
    async with AsyncEvaluatorClient(args.url, token=args.token, timeout_s=http_timeout(args)) as client:
        tasks = [asyncio.ensure_future(_score_row(client, gate, args, row)) for row in todo]
        for done, task in enumerate(asyncio.as_completed(tasks), start=1):
            row = await task
            speed = f" {row.result.speedup:.2f}x" if row.result and row.result.speedup else ""
            print(f"[{done}/{len(todo)}] {row.problem.name}: {row.status}{speed}", file=sys.stderr, flush=True)


def batch_report(rows: Sequence[BatchRow], selected: int | None = None) -> str:
    """The table and fast_p over `rows`; `selected` is how many problems were selected, when more than `rows`."""
    table = format_table(
        ("problem", "status", "speedup", "reference ms", "candidate ms", "note"),
        [
            (
                r.problem.id,
                r.status,
                _num(r.result.speedup if r.result else None, ".2f"),
                _num(r.result.reference_ms.median if r.result and r.result.reference_ms else None),
                _num(r.result.candidate_ms.median if r.result and r.result.candidate_ms else None),
                r.note,
            )
            for r in rows
        ],
    )
    outcomes = [r.outcome for r in rows]
    geomean = geomean_speedup(outcomes)
    attempted = sum(r.candidate is not None for r in rows)
    summary = [
        f"problems: {len(rows) if selected is None else selected} selected, {attempted} with a candidate, "
        f"correct: {sum(o.correct for o in outcomes)}",
        f"fast_p over {len(rows)} problem(s)"
        + (" (every selected problem; missing candidates count as failed)" if attempted < len(rows) else "")
        + (" (those with a candidate; --all counts every selected problem)" if selected else ""),
    ]
    summary += [f"fast_{p:g}: {fast_p(outcomes, p):.3f}" for p in FAST_P_THRESHOLDS]
    summary.append(f"geomean speedup (correct): {'-' if geomean is None else f'{geomean:.3f}x'}")
    not_scored = sum(r.status in {"error", EvaluationStatus.evaluator_error.value} for r in rows)
    if not_scored:
        summary.append(f"warning: {not_scored} candidate(s) not scored because of service errors; counted as failed")
    return table + "\n\n" + "\n".join(summary)


def write_jsonl(rows: Sequence[BatchRow], path: Path) -> None:
    with path.open("w", encoding="utf-8") as out:
        for r in rows:
            record = {
                "problem_id": r.problem.id,
                "level": r.problem.level,
                "reference_hash": r.problem.hash,
                "candidate": str(r.candidate) if r.candidate else None,
                "status": r.status,
                "result": r.result.model_dump(mode="json") if r.result else None,
                "error": r.error,
            }
            out.write(json.dumps(record) + "\n")


def run_batch(args: argparse.Namespace) -> int:
    rows, unmatched = match_candidates(select_problems(args), args.candidates)
    if not rows:
        raise CliError("no problems selected: check that --level matches the level<N>/ folders of the checkout")
    for path in unmatched:
        print(f"ignored {path.name}: it names no selected problem", file=sys.stderr)
    if not any(row.candidate for row in rows):
        raise CliError(f"no candidate in {args.candidates} names a selected problem (see `candidate_names`)")
    check_reachable(args.url, args.token)
    asyncio.run(score_rows(rows, args))
    selected = len(rows)
    if not args.all:
        rows = [row for row in rows if row.candidate is not None]
    print(batch_report(rows, selected if len(rows) < selected else None))
    if args.out:
        write_jsonl(rows, args.out)
        print(f"results written to {args.out}", file=sys.stderr)
    return 0


def run_problems(args: argparse.Namespace) -> int:
    """List the selected problems, one `id  level  name` line each."""
    chosen = select_problems(args)
    print(format_table(("id", "level", "name"), [(p.id, p.level, p.name) for p in chosen]))
    print(
        f"{len(chosen)} problem(s); a batch candidate is named {candidate_names(chosen[0])[0]!r} etc.", file=sys.stderr
    )
    return 0


# ---- argument parsing ----------------------------------------------------------------------------------------------


def _levels(text: str) -> list[int]:
    try:
        return [int(part) for part in text.split(",") if part.strip()]
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"expected levels like 1 or 1,2, got {text!r}") from exc


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"expected seconds, got {text!r}") from exc
    if not 0 < value <= 3600:
        raise argparse.ArgumentTypeError("must lie in (0, 3600]")
    return value


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError("must be at least 1")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="kernel-agent",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        allow_abbrev=False,
    )
    common = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    common.add_argument(
        "--url", default=os.environ.get("EVALUATOR_URL", DEFAULT_URL), help="evaluator base URL ($EVALUATOR_URL)"
    )
    common.add_argument("--token", default=os.environ.get("EVALUATOR_TOKEN"), help="bearer token ($EVALUATOR_TOKEN)")
    common.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    common.add_argument("--timing-trials", type=int, default=100, help="timed calls per model (0 skips timing)")
    common.add_argument("--correctness-trials", type=int, default=5, help="random input draws checked")
    common.add_argument(
        "--timeout", type=_seconds, default=None, help="wall-clock limit of one evaluation in s (server default)"
    )
    sub = parser.add_subparsers(dest="command", required=True)
    defaults = argparse.ArgumentDefaultsHelpFormatter

    score = sub.add_parser(
        "score", parents=[common], help="score one candidate against one reference", formatter_class=defaults
    )
    score.add_argument(
        "--reference", type=Path, required=True, help="module defining Model, get_inputs, get_init_inputs"
    )
    score.add_argument("--candidate", type=Path, required=True, help="module defining ModelNew")
    score.add_argument("--json", action="store_true", help="print the full verdict as JSON")
    score.set_defaults(run=run_score)

    batch = sub.add_parser(
        "batch", parents=[common], help="score a folder of candidates, print fast_p", formatter_class=defaults
    )
    listing = sub.add_parser("problems", help="list the problems a batch would select", formatter_class=defaults)
    listing.set_defaults(run=run_problems)
    for command in (batch, listing):
        where = command.add_mutually_exclusive_group()
        where.add_argument(
            "--kernelbench",
            type=Path,
            default=None,
            help="KernelBench checkout (default $KERNELBENCH_PATH, else the HF dataset)",
        )
        where.add_argument("--problems", help="a problem spec instead, e.g. builtin or builtin:gpu")
        command.add_argument("--level", type=_levels, default=[1], help="KernelBench level(s), e.g. 1 or 1,2")
    batch.add_argument("--candidates", type=Path, required=True, help="folder of candidate files named after problems")
    batch.add_argument("--concurrency", type=_positive, default=4, help="evaluations in flight at once")
    batch.add_argument("--out", type=Path, default=None, help="write one JSON line per reported problem here")
    batch.add_argument(
        "--all", action="store_true", help="report every selected problem; missing candidates count as failed"
    )
    batch.set_defaults(run=run_batch)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.run(args))
    except CliError as exc:
        print(f"kernel-agent: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
