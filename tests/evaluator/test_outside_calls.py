"""The steps around the timed calls (drawing the inputs, the digest) run the same code on both sides: a candidate
slower there in nearly every pair of blocks, by either clock, moved work out of its timed calls."""

from __future__ import annotations

import random

from services.evaluator.evaluation import Block, slower_outside_calls


def _blocks(rng: random.Random, drawn_s: float, drawn_wall_s: float, digest_wall_s: float = 1e-3) -> list[Block]:
    """20 blocks whose steps take the given seconds, each with 10 % noise."""
    noisy = lambda s: s * rng.uniform(0.9, 1.1)  # noqa: E731
    return [
        Block(
            [1.0] * 8,
            clocked_s=8e-3,
            wall_s=8e-3,
            sketches=None,
            drawn_s=noisy(drawn_s),
            drawn_wall_s=noisy(drawn_wall_s),
            digest_s=noisy(1e-3),
            digest_wall_s=noisy(digest_wall_s),
        )
        for _ in range(20)
    ]


def test_the_same_steps_on_both_sides_are_not_flagged():
    rng = random.Random(0)
    assert slower_outside_calls(_blocks(rng, 2e-3, 2e-3), _blocks(rng, 2e-3, 2e-3)) == ""


def test_a_draw_that_takes_cpu_time_is_flagged_by_the_judges_clock():
    rng = random.Random(1)
    found = slower_outside_calls(_blocks(rng, 2e-3, 2e-3), _blocks(rng, 20e-3, 20e-3))
    assert found.startswith("drawing the inputs") and "by the judge's clock" in found


def test_a_draw_that_takes_only_wall_time_is_flagged_by_the_wall_clock():
    """Helpers that compute while the inputs are drawn and exit before the reply take their CPU time with them."""
    rng = random.Random(2)
    found = slower_outside_calls(_blocks(rng, 2e-3, 2e-3), _blocks(rng, 2e-3, 20e-3))
    assert found.startswith("drawing the inputs") and "by the wall clock" in found


def test_a_digest_that_takes_only_wall_time_is_flagged():
    rng = random.Random(3)
    found = slower_outside_calls(_blocks(rng, 2e-3, 2e-3), _blocks(rng, 2e-3, 2e-3, digest_wall_s=20e-3))
    assert found.startswith("the output digest") and "by the wall clock" in found


def test_a_wall_clock_slower_within_the_slack_is_not_flagged():
    """5 % of the step and 0.2 ms: a busy machine stretches one side's steps a little, not a flag."""
    rng = random.Random(4)
    assert slower_outside_calls(_blocks(rng, 2e-3, 2e-3), _blocks(rng, 2e-3, 2.1e-3)) == ""
