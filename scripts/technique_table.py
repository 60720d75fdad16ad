"""Score every builtin-implementer technique on every built-in problem with the real services, and record the table.

Starts the evaluator and the implementer (IMPLEMENTER_BACKEND=builtin) on 127.0.0.1, asks the implementer to apply
each technique's example suggestion to each reference, scores the result with the evaluator, and writes the
technique x problem table (verdict, speedup) between the table markers of docs/implementer.md.

    python scripts/technique_table.py                   # all techniques, all problems, cpu sizes
    python scripts/technique_table.py --techniques torch_compile --problems builtin/softmax_primitives
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from problems import Problem, builtin_problems  # noqa: E402
from services.implementer.rules import TECHNIQUES  # noqa: E402
from shared.clients import EvaluatorClient, ImplementerClient  # noqa: E402
from shared.contracts import EvaluateRequest, ImplementRequest  # noqa: E402
from tests.servers import run_service  # noqa: E402

START, END = "<!-- technique-table:start -->", "<!-- technique-table:end -->"
FASTER = 1.1  # a speedup counts as "measurably faster" above this


@dataclass
class Cell:
    problem: str
    technique: str
    applied: bool
    verdict: str = ""
    speedup: float | None = None
    note: str = ""

    def text(self) -> str:
        if not self.applied:
            return "-"
        if self.verdict == "correct":
            return f"correct {self.speedup:.2f}x" if self.speedup is not None else "correct"
        return self.verdict


def score(
    implementer: ImplementerClient,
    evaluator: EvaluatorClient,
    problem: Problem,
    technique: str,
    example: str,
    args: argparse.Namespace,
) -> Cell:
    reply = implementer.implement(
        ImplementRequest(
            reference_source=problem.source, current_source=problem.source, suggestion=example, target=args.target
        )
    )
    if reply.status != "ok" or technique not in reply.techniques:
        return Cell(problem.id, technique, False, note=reply.message)
    result = evaluator.evaluate(
        EvaluateRequest(
            reference_source=problem.source,
            candidate_source=reply.source or "",
            device="cpu",
            correctness_trials=3,
            timing_trials=args.timing_trials,
            warmup_trials=3,
            timeout_s=args.timeout_s,
            seed=0,
        )
    )
    print(f"{problem.id:40s} {technique:20s} {result.status.value:14s} {result.speedup}", flush=True)
    return Cell(problem.id, technique, True, result.status.value, result.speedup, result.message[:300])


def table(cells: list[Cell], techniques: list[str], problems: list[str]) -> str:
    by_key = {(c.problem, c.technique): c for c in cells}
    lines = ["| problem | " + " | ".join(f"`{t}`" for t in techniques) + " |", "|---|" + "---|" * len(techniques)]
    for problem in problems:
        row = [by_key[(problem, t)].text() if (problem, t) in by_key else "" for t in techniques]
        lines.append(f"| `{problem.removeprefix('builtin/')}` | " + " | ".join(row) + " |")
    faster = sorted({c.technique for c in cells if c.verdict == "correct" and (c.speedup or 0) > FASTER})
    lines += [
        "",
        f"Techniques measurably faster (> {FASTER}x, correct) than the reference on at least one problem: "
        + (", ".join(f"`{t}`" for t in faster) or "none")
        + ".",
    ]
    return "\n".join(lines)


def write_docs(path: Path, text: str, header: str) -> None:
    block = f"{START}\n{header}\n\n{text}\n{END}"
    current = path.read_text() if path.exists() else ""
    if START in current and END in current:
        current = re.sub(re.escape(START) + ".*?" + re.escape(END), lambda _: block, current, flags=re.DOTALL)
    else:
        current = current.rstrip() + "\n\n" + block + "\n"
    path.write_text(current)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--techniques", nargs="*", default=[t.name for t in TECHNIQUES])
    parser.add_argument("--problems", nargs="*", default=None, help="problem ids (default: every built-in problem)")
    parser.add_argument("--target", default="cuda", choices=["cuda", "triton", "torch"])
    parser.add_argument("--timing-trials", type=int, default=30)
    parser.add_argument("--timeout-s", type=float, default=900.0)
    parser.add_argument("--parallel", type=int, default=2, help="evaluations in flight (the evaluator's workers)")
    parser.add_argument("--docs", type=Path, default=REPO / "docs" / "implementer.md")
    parser.add_argument("--json", type=Path, default=None, help="also write the raw cells here")
    args = parser.parse_args()
    problems = [p for p in builtin_problems("cpu") if args.problems is None or p.id in args.problems]
    examples = {t.name: t.example for t in TECHNIQUES if t.name in args.techniques}
    env = {"PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    with (
        run_service("evaluator", env=env, timeout_s=300) as eval_url,
        run_service("implementer", env={**env, "IMPLEMENTER_BACKEND": "builtin"}) as impl_url,
        ImplementerClient(impl_url) as implementer,
        EvaluatorClient(eval_url, timeout_s=args.timeout_s + 60) as evaluator,
    ):
        jobs = [(p, name, example) for name, example in examples.items() for p in problems]
        with ThreadPoolExecutor(args.parallel) as pool:
            cells = list(pool.map(lambda job: score(implementer, evaluator, *job, args), jobs))
    if args.json:
        args.json.write_text(json.dumps([asdict(c) for c in cells], indent=1))
    header = (
        f"Generated by `python scripts/technique_table.py` (target `{args.target}`, cpu sizes, evaluator on CPU, "
        f"{args.timing_trials} timing trials; `-` = technique does not apply to that problem)."
    )
    write_docs(args.docs, table(cells, list(examples), [p.id for p in problems]), header)
    print(table(cells, list(examples), [p.id for p in problems]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
