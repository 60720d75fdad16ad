"""Learning benchmark: configs/default.yaml for 30 updates against a real evaluator and builtin implementer started
here on 127.0.0.1; writes bench/results/learning.json and learning.png and prints the mean reward of the first 5
updates against the last 5.

    python bench/learning.py [--updates 30] [--config configs/default.yaml] [--summarize RUN_DIR] [--name NAME]

`--summarize RUN_DIR` only reads an existing run's metrics.jsonl (e.g. a run still going or cut short); `--name`
names the result files (bench/results/NAME.json and NAME.png; default `learning`).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from services.implementer.rules import recognise  # noqa: E402
from services.trainer.logging_utils import plot_reward_curve  # noqa: E402
from tests.servers import run_service  # noqa: E402

RESULTS = REPO / "bench" / "results"


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []


def suggestion_stats(turns: list[dict]) -> dict[int, dict[str, float]]:
    """Per update, what the policy wrote: the share of suggestions naming a technique the builtin implementer knows,
    and the most named technique's share. Unlike the mean reward, this does not depend on which problems came up."""
    by_update: dict[int, list[dict]] = {}
    for turn in turns:
        by_update.setdefault(turn["update"], []).append(turn)
    stats = {}
    for update, rows in sorted(by_update.items()):
        named = [[t.name for t in recognise(row["suggestion"] or "")] for row in rows]
        counts: dict[str, int] = {}
        for names in named:
            for name in names:
                counts[name] = counts.get(name, 0) + 1
        stats[update] = {
            "named_technique_rate": sum(bool(n) for n in named) / len(rows),
            "top_technique_rate": max(counts.values(), default=0) / len(rows),
        }
    return stats


def per_problem_first_last(turns: list[dict]) -> dict[str, dict[str, float]]:
    """Mean reward of each problem at the first and the last update it came up in (problems seen at least twice):
    the same problem early and late, so the comparison is not a comparison of problem difficulty."""
    rewards: dict[str, dict[int, list[float]]] = {}
    for turn in turns:
        if turn.get("reward") is not None:
            rewards.setdefault(turn["problem_id"], {}).setdefault(turn["update"], []).append(turn["reward"])
    return {
        problem: {
            "first_update": min(by_update),
            "last_update": max(by_update),
            "first": statistics.fmean(by_update[min(by_update)]),
            "last": statistics.fmean(by_update[max(by_update)]),
        }
        for problem, by_update in sorted(rewards.items())
        if len(by_update) >= 2
    }


def identical_kernel_spread(turns: list[dict]) -> float | None:
    """Median relative std of the speedups that one kernel got from separate evaluations within an update (runs
    with `reuse_evaluations: false`): how much of a group's reward spread is timing noise. None without repeats."""
    speedups: dict[tuple, list[float]] = {}
    for turn in turns:
        measured = not turn.get("evaluation_reused") and not turn.get("scored_as_baseline")
        if turn.get("speedup") is not None and measured:
            key = (turn["update"], turn["problem_id"], turn["kernel_hash"])
            speedups.setdefault(key, []).append(turn["speedup"])
    spreads = [statistics.pstdev(v) / statistics.fmean(v) for v in speedups.values() if len(v) > 1]
    return statistics.median(spreads) if spreads else None


def summarize(run_dir: Path, config: str, wall_s: float | None, name: str = "learning") -> dict[str, object]:
    rows = read_jsonl(run_dir / "metrics.jsonl")
    turns = read_jsonl(run_dir / "episodes.jsonl")
    suggestions = suggestion_stats(turns)
    problems = per_problem_first_last(turns)
    rewards = [r["reward/mean"] for r in rows]
    changed = [r["rate/kernel_changed"] for r in rows if "rate/kernel_changed" in r]  # runs before it lack it
    window = min(5, len(rewards) // 2) or 1
    summary: dict[str, object] = {
        "config": config,
        "run_dir": str(run_dir),
        "updates_done": len(rows),
        "wall_s": wall_s,
        "window": window,
        "first_mean_reward": statistics.fmean(rewards[:window]) if rewards else None,
        "last_mean_reward": statistics.fmean(rewards[-window:]) if rewards else None,
        # the share of suggestions that changed the kernel does not depend on which problems an update drew
        "first_kernel_changed": statistics.fmean(changed[:window]) if changed else None,
        "last_kernel_changed": statistics.fmean(changed[-window:]) if changed else None,
        "curve": [
            {
                k: r.get(k)
                for k in (
                    "update",
                    "reward/mean",
                    "reward/std",
                    "rate/compiled",
                    "rate/correct",
                    "rate/kernel_changed",
                    "speedup/mean",
                    "reward/frac_zero_std_groups",
                    "services/evaluations",
                    "losses/kl",
                    "time/services_s",
                    "time/update_s",
                )
            }
            | suggestions.get(r["update"], {})
            for r in rows
        ],
        "per_problem": problems,
        "per_problem_first_mean": statistics.fmean(p["first"] for p in problems.values()) if problems else None,
        "per_problem_last_mean": statistics.fmean(p["last"] for p in problems.values()) if problems else None,
        "per_problem_improved": sum(p["last"] > p["first"] for p in problems.values()),
        "identical_kernel_speedup_spread": identical_kernel_spread(turns),
    }
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"{name}.json").write_text(json.dumps(summary, indent=2))
    plot_reward_curve(run_dir / "metrics.jsonl", RESULTS / f"{name}.png")
    print(
        f"updates {len(rows)}: mean reward of the first {window} = {summary['first_mean_reward']}, "
        f"last {window} = {summary['last_mean_reward']}; kernel changed by {summary['first_kernel_changed']} / "
        f"{summary['last_kernel_changed']} of the suggestions; {len(problems)} problems seen twice or more: "
        f"first visit {summary['per_problem_first_mean']}, last visit {summary['per_problem_last_mean']}, "
        f"{summary['per_problem_improved']} improved"
    )
    return summary


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default="configs/default.yaml")
    parser.add_argument("--updates", type=int, default=30)
    parser.add_argument("--run-dir", type=Path, default=REPO / "runs" / "bench-learning")
    parser.add_argument("--summarize", type=Path, help="only summarise this existing run directory")
    parser.add_argument("--name", default="learning", help="stem of the result files in bench/results/")
    args = parser.parse_args()
    if args.summarize:
        summarize(args.summarize, args.config, None, args.name)
        return 0
    RESULTS.mkdir(parents=True, exist_ok=True)
    args.run_dir.parent.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    with (
        run_service("evaluator", log_path=args.run_dir.with_name("bench-learning-evaluator.log")) as evaluator,
        run_service(
            "implementer",
            env={"IMPLEMENTER_BACKEND": "builtin"},
            log_path=args.run_dir.with_name("bench-learning-implementer.log"),
        ) as implementer,
    ):
        command = [
            sys.executable,
            "-m",
            "services.trainer",
            "--config",
            args.config,
            "--updates",
            str(args.updates),
            "--save-every",
            "5",
            "--output-dir",
            str(args.run_dir),
            "--evaluator-url",
            evaluator,
            "--implementer-url",
            implementer,
        ]
        if (args.run_dir / "checkpoints").exists():
            command.append("--resume")
        code = subprocess.call(command, cwd=REPO)
    summarize(args.run_dir, args.config, time.perf_counter() - start, args.name)
    return code


if __name__ == "__main__":
    sys.exit(main())
