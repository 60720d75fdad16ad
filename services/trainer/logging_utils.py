"""Run outputs: metrics.jsonl (one line per update), episodes.jsonl (one line per turn), TensorBoard scalars with
slash names, reward_curve.png, and the rich progress bar."""

from __future__ import annotations

import json
import logging
from dataclasses import asdict
from pathlib import Path
from typing import Any

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from services.trainer.episodes import Turn

log = logging.getLogger(__name__)

EPISODE_FIELDS = (
    "problem_id",
    "trajectory",
    "turn",
    "suggestion",
    "kernel_hash",
    "implement_status",
    "verdict",
    "reward",
    "ret",
    "advantage",
    "speedup",
    "eval_latency_s",
    "evaluation_reused",
    "scored_as_baseline",
    "kernel_changed",
    "finished",
    "message",
)


def truncate_jsonl(path: Path, after_update: int) -> None:
    """Drop lines of updates after `after_update` (written after the checkpoint a run resumes from)."""
    if not path.exists():
        return
    kept = [
        line
        for line in path.read_text().splitlines()
        if line.strip() and json.loads(line).get("update", 0) <= after_update
    ]
    path.write_text("".join(line + "\n" for line in kept))


class RunLogger:
    def __init__(self, run_dir: Path, enabled: bool = True) -> None:
        self.run_dir, self.enabled = run_dir, enabled
        self.metrics_path, self.episodes_path = run_dir / "metrics.jsonl", run_dir / "episodes.jsonl"
        self.writer: Any = None
        if enabled:
            from torch.utils.tensorboard import SummaryWriter

            self.writer = SummaryWriter(log_dir=str(run_dir / "tensorboard"))

    def log_update(self, update: int, metrics: dict[str, float], turns: list[Turn]) -> None:
        if not self.enabled:
            return
        with self.episodes_path.open("a") as episodes:
            for turn in turns:
                row = {"update": update, **{k: v for k, v in asdict(turn).items() if k in EPISODE_FIELDS}}
                episodes.write(json.dumps(row) + "\n")
        with self.metrics_path.open("a") as out:
            out.write(json.dumps({"update": update, **metrics}) + "\n")
        for name, value in metrics.items():
            self.writer.add_scalar(name, value, update)
        self.writer.flush()
        log.info(
            "update %d: %s",
            update,
            " ".join(f"{k}={v:.4g}" for k, v in metrics.items() if k.startswith(("reward/", "rate/", "losses/"))),
        )

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()


def plot_reward_curve(metrics_path: Path, out_path: Path) -> None:
    """reward/mean per update with its std band, and the correct rate."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    rows = [json.loads(line) for line in metrics_path.read_text().splitlines() if line.strip()]
    if not rows:
        return
    steps = [r["update"] for r in rows]
    mean = [r["reward/mean"] for r in rows]
    std = [r["reward/std"] for r in rows]
    fig, ax = plt.subplots(figsize=(7, 4))
    # Markers and error bars: after one update a line or a band has no length, and the plot looked empty.
    ax.errorbar(steps, mean, yerr=std, label="mean reward ± std", color="C0", marker="o", capsize=4)
    ax.plot(steps, [r["rate/correct"] for r in rows], label="correct rate", color="C2", linestyle="--", marker="s")
    if all("rate/kernel_changed" in r for r in rows):
        changed = [r["rate/kernel_changed"] for r in rows]
        ax.plot(steps, changed, label="kernel changed (share)", color="C1", linestyle=":", marker="^")
    if len(steps) == 1:
        ax.set_xlim(steps[0] - 1, steps[0] + 1)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # updates are whole numbers
    ax.set_xlabel("update")
    ax.set_ylabel("reward")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(out_path, dpi=120)
    plt.close(fig)


def make_progress(enabled: bool) -> Progress:
    return Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TextColumn("{task.fields[info]}"),
        disable=not enabled,
        transient=False,
    )
