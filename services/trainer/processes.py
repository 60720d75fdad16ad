"""What several training processes (torchrun / accelerate launch) do together: agree on stopping, run as many
backward passes, share their turns for the logs, and leave the shared files to the main process. With one process
each of these is a no-op."""

from __future__ import annotations

import logging
import signal
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from services.trainer.episodes import Turn
from services.trainer.logging_utils import truncate_jsonl

log = logging.getLogger(__name__)


class StopFlag:
    """First SIGINT/SIGTERM: finish cleanly at the next safe point; a second SIGINT interrupts at once."""

    def __init__(self) -> None:
        self.requested = False
        signal.signal(signal.SIGINT, self._handle)
        signal.signal(signal.SIGTERM, self._handle)

    def _handle(self, signum: int, frame: Any) -> None:
        log.warning("signal %d: stopping after the current step (again to abort)", signum)
        self.requested = True
        signal.signal(signal.SIGINT, signal.default_int_handler)

    def __call__(self) -> bool:
        return self.requested

    def agreed(self, accelerator: Any) -> bool:
        """Whether any process was asked to stop. A collective, called at the same points by every process: signals
        reach processes at different moments, and a process that left the loop alone would leave the others waiting
        in their next collective (or enter a different one)."""
        if accelerator.num_processes > 1:
            flag = torch.tensor([float(self.requested)], device=accelerator.device)
            self.requested = bool(accelerator.reduce(flag, reduction="max").item())
        return self.requested


def truncate_logs(run_dir: Path, update: int, accelerator: Any) -> None:
    """On resume, drop the log lines of updates after the checkpoint (a killed run may have logged them; they are
    redone). Only the main process rewrites the files, as only it appends to them; the others wait until it is done."""
    if accelerator.is_main_process:
        for name in ("metrics.jsonl", "episodes.jsonl"):
            truncate_jsonl(run_dir / name, update)
    accelerator.wait_for_everyone()


def equalise_steps(steps: list[list[list[int]]], accelerator: Any) -> list[list[list[int]]]:
    """Under several processes every one must run as many optimizer steps and as many backward passes in each step
    (DDP all-reduces in every backward): pad every step to the most mini-batches any process has in a step, and the
    steps to the most steps, with empty mini-batches, which run with zero weight."""
    if accelerator is None or accelerator.num_processes == 1:
        return steps
    mine = torch.tensor([len(steps), max((len(step) for step in steps), default=0)], device=accelerator.device)
    most_steps, most_minis = (int(v) for v in accelerator.gather(mine.unsqueeze(0)).max(dim=0).values)
    padded = [step + [[] for _ in range(most_minis - len(step))] for step in steps]
    return padded + [[[] for _ in range(most_minis)] for _ in range(most_steps - len(steps))]


def gather_turns(turns: list[Turn], accelerator: Any, groups_per_process: int) -> tuple[list[Turn], list[Turn]]:
    """Every process's turns and the samples among them (for metrics and episodes.jsonl), with group numbers made
    unique across processes; the optimisation keeps using this process's own samples."""
    if accelerator.num_processes > 1:
        from accelerate.utils import gather_object

        offset = accelerator.process_index * groups_per_process
        turns = gather_object([replace(t, group=t.group + offset) for t in turns])
    return turns, [t for t in turns if t.reward is not None]  # as assign_returns_and_advantages
