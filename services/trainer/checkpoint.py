"""Checkpoints: weights (or adapter), optimizer, scheduler, RNG states, update number and config, written to a temp
folder and renamed into place, so a checkpoint folder is either complete or absent."""

from __future__ import annotations

import json
import random
import shutil
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import torch

PREFIX = "update-"


def checkpoint_dir(run_dir: Path) -> Path:
    return run_dir / "checkpoints"


def latest_checkpoint(run_dir: Path) -> Path | None:
    found = sorted(p for p in checkpoint_dir(run_dir).glob(f"{PREFIX}*") if (p / "state.json").exists())
    return found[-1] if found else None


def rng_states() -> dict[str, Any]:
    return {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None,
    }


def set_rng_states(states: dict[str, Any]) -> None:
    random.setstate(states["python"])
    np.random.set_state(states["numpy"])
    torch.set_rng_state(states["torch"])
    if states.get("cuda") is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(states["cuda"])


def save_checkpoint(
    run_dir: Path,
    update: int,
    model: Any,
    tokenizer: Any,
    optimizer: torch.optim.Optimizer,
    scheduler: Any,
    config: dict[str, Any],
    keep: int,
) -> Path:
    """Write checkpoints/update-NNNNNN atomically and delete all but the newest `keep`."""
    root = checkpoint_dir(run_dir)
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"{PREFIX}{update:06d}"
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}-", dir=root))
    try:
        model.save_pretrained(tmp / "model")
        tokenizer.save_pretrained(tmp / "model")
        torch.save(optimizer.state_dict(), tmp / "optimizer.pt")
        torch.save(scheduler.state_dict(), tmp / "scheduler.pt")
        torch.save(rng_states(), tmp / "rng.pt")
        (tmp / "state.json").write_text(json.dumps({"update": update, "config": config}, indent=2))
        if final.exists():
            shutil.rmtree(final)
        tmp.rename(final)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    for old in sorted(p for p in root.glob(f"{PREFIX}*"))[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def load_checkpoint(path: Path, optimizer: torch.optim.Optimizer, scheduler: Any) -> int:
    """Restore optimizer, scheduler and RNG states (weights are loaded with the model); returns the update."""
    optimizer.load_state_dict(torch.load(path / "optimizer.pt", weights_only=False))
    scheduler.load_state_dict(torch.load(path / "scheduler.pt", weights_only=False))
    set_rng_states(torch.load(path / "rng.pt", weights_only=False))
    return int(json.loads((path / "state.json").read_text())["update"])
