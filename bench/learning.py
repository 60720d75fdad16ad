"""Learning benchmark: configs/default.yaml for 30 updates against a real evaluator and builtin implementer started
here on 127.0.0.1; writes bench/results/learning.json and learning.png and prints the mean reward of the first 5
updates against the last 5.

    python bench/learning.py [--updates 30] [--config configs/default.yaml] [--summarize RUN_DIR]

`--summarize RUN_DIR` only reads an existing run's metrics.jsonl (e.g. a run still going or cut short).
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

from services.trainer.logging_utils import plot_reward_curve  # noqa: E402
from tests.servers import run_service  # noqa: E402

RESULTS = REPO / "bench" / "results"


def summarize(run_dir: Path, config: str, wall_s: float | None) -> dict[str, object]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    rewards = [r["reward/mean"] for r in rows]
    window = min(5, len(rewards) // 2) or 1
    summary: dict[str, object] = {
        "config": config,
        "run_dir": str(run_dir),
        "updates_done": len(rows),
        "wall_s": wall_s,
        "window": window,
        "first_mean_reward": statistics.fmean(rewards[:window]) if rewards else None,
        "last_mean_reward": statistics.fmean(rewards[-window:]) if rewards else None,
        "curve": [
            {
                k: r.get(k)
                for k in (
                    "update",
                    "reward/mean",
                    "reward/std",
                    "rate/compiled",
                    "rate/correct",
                    "speedup/mean",
                    "losses/kl",
                    "time/update_s",
                )
            }
            for r in rows
        ],
    }
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "learning.json").write_text(json.dumps(summary, indent=2))
    plot_reward_curve(run_dir / "metrics.jsonl", RESULTS / "learning.png")
    print(
        f"updates {len(rows)}: mean reward of the first {window} = {summary['first_mean_reward']}, "
        f"last {window} = {summary['last_mean_reward']}"
    )
    return summary


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default="configs/default.yaml")
    parser.add_argument("--updates", type=int, default=30)
    parser.add_argument("--run-dir", type=Path, default=REPO / "runs" / "bench-learning")
    parser.add_argument("--summarize", type=Path, help="only summarise this existing run directory")
    args = parser.parse_args()
    if args.summarize:
        summarize(args.summarize, args.config, None)
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
    summarize(args.run_dir, args.config, time.perf_counter() - start)
    return code


if __name__ == "__main__":
    sys.exit(main())
