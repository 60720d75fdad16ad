"""What a person watching a run sees: a reward curve that shows one update, and a warning when an update had
nothing to learn from."""

from __future__ import annotations

import json
import logging

import numpy as np

from services.trainer.grpo import has_signal
from services.trainer.logging_utils import plot_reward_curve

ROW = {"update": 1, "reward/mean": 0.9, "reward/std": 0.5, "rate/correct": 1.0, "rate/kernel_changed": 0.25}


def _pixels_of(png, rgb, tolerance=12):
    import matplotlib.image

    image = (matplotlib.image.imread(png)[..., :3] * 255).astype(int)
    return int((np.abs(image - np.array(rgb)).max(axis=-1) <= tolerance).sum())


def test_the_reward_curve_shows_a_single_update(tmp_path):
    metrics = tmp_path / "metrics.jsonl"
    metrics.write_text(json.dumps(ROW) + "\n")
    plot_reward_curve(metrics, tmp_path / "reward_curve.png")
    # the mean reward's colour (matplotlib C0): a marker and an error bar, not only the legend's sample line
    assert _pixels_of(tmp_path / "reward_curve.png", (31, 119, 180)) > 300


def _metrics(samples, frac_zero):
    return {"samples": samples, "reward/frac_zero_std_groups": frac_zero, "rate/kernel_changed": 0.0}


def test_an_update_without_signal_is_reported(caplog):
    with caplog.at_level(logging.WARNING, logger="services.trainer.grpo"):
        assert has_signal(1, _metrics(16, 0.5), warn=True)
        assert not caplog.records
        assert not has_signal(2, _metrics(16, 1.0), warn=True)
        assert not has_signal(3, _metrics(0, 0.0), warn=True)  # no sample at all
        assert not has_signal(4, _metrics(16, 1.0), warn=False)  # other processes stay quiet
    messages = [r.getMessage() for r in caplog.records]
    assert len(messages) == 2 and all("nothing to learn from" in m for m in messages)
    assert "0% of the suggestions changed the kernel" in messages[0]
