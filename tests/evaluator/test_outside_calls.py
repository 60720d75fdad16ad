"""The steps around the timed calls (drawing the inputs, the digest) run the same code on both sides: a candidate
slower there beyond chance (in nearly every pair of blocks, or in its slowest blocks) moved work out of its timed
calls. The draw's CPU time beyond the reference's is counted in its samples (charged_outside_calls), never flagged;
the draw's time off the CPU and the digest, by either clock, are flagged."""

from __future__ import annotations

import random
import statistics

from services.evaluator.evaluation import Block, charged_outside_calls, slower_outside_calls


def _blocks(
    rng: random.Random,
    drawn_s: float,
    drawn_wall_s: float,
    digest_wall_s: float = 1e-3,
    count: int = 20,
    wall_s: float = 8e-3,
    clocked_s: float = 8e-3,
) -> list[Block]:
    """`count` blocks whose steps take the given seconds, each with 10 % noise; 8 ms of reported calls each, in a
    block of `clocked_s` by the judge's clock and `wall_s` by the wall clock."""
    noisy = lambda s: s * rng.uniform(0.9, 1.1)  # noqa: E731
    return [
        Block(
            [1.0] * 8,
            clocked_s=clocked_s,
            wall_s=wall_s,
            sketches=None,
            drawn_s=noisy(drawn_s),
            drawn_wall_s=noisy(drawn_wall_s),
            digest_s=noisy(1e-3),
            digest_wall_s=noisy(digest_wall_s),
        )
        for _ in range(count)
    ]


def test_the_same_steps_on_both_sides_are_not_flagged():
    rng = random.Random(0)
    assert slower_outside_calls(_blocks(rng, 2e-3, 2e-3), _blocks(rng, 2e-3, 2e-3)) == ""


def test_a_draw_that_takes_cpu_time_is_charged_not_flagged():
    """Work moved into the draw by the judge's clock buys nothing (it is counted in the samples), and that clock cannot
    tell it from a process whose identical draws run slower: an honest candidate was rejected so in CI."""
    rng = random.Random(1)
    reference, candidate = _timed(rng, 1.0, 2e-3, 2e-3), _timed(rng, 0.0, 10e-3, 10e-3)
    assert slower_outside_calls(reference, candidate) == ""
    assert 0.9 < _charged_median(reference, candidate) < 1.1


def _every_draw_slower_by(extra_s: float, drawn_s: float = 11.9e-3) -> str:
    """20 ms blocks on both clocks, the reference's draws `drawn_s`, the candidate's `extra_s` slower in every block."""
    rng = random.Random(10)
    reference = _blocks(rng, drawn_s, drawn_s, wall_s=20e-3, clocked_s=20e-3)
    candidate = _blocks(rng, drawn_s + extra_s, drawn_s + extra_s, wall_s=20e-3, clocked_s=20e-3)
    return slower_outside_calls(reference, candidate)


def test_an_honest_candidates_slower_draws_are_not_flagged():
    """Honest candidates' draws took 13.5 against 11.9 ms, and 8.6 against 7.3 ms, per block in every pair of three
    rounds, in two CI runs. Under a quarter of the block, that is counted in their time, not flagged."""
    assert _every_draw_slower_by(1.6e-3) == ""
    assert _every_draw_slower_by(1.3e-3, drawn_s=7.3e-3) == ""


def test_an_honest_candidates_slower_draws_on_a_loaded_machine_are_not_flagged():
    """Draws 17 % slower on the CPU, four times the calls' time, with half a core: waiting for it stretches the slower
    draws' wall time in proportion, so their time off the CPU is 4 ms longer; beyond what the CPU time explains,
    it is the reference's."""
    rng = random.Random(19)
    reference = _blocks(rng, 24e-3, 48e-3, wall_s=16e-3)
    candidate = _blocks(rng, 28e-3, 56e-3, wall_s=16e-3)
    for block in reference + candidate:  # one noise on both clocks of a draw
        block.drawn_wall_s = block.drawn_s / 0.5
    assert slower_outside_calls(reference, candidate) == ""


def test_an_honest_candidate_whose_draws_take_two_and_a_half_times_the_references_is_not_flagged():
    """A CI run's draws: 55.5 against 22.4 ms per block by the judge's clock, their wall time as long as their CPU
    time on both sides (rejected while the draw's CPU time was flagged)."""
    assert _every_draw_slower_by(33.1e-3, drawn_s=22.4e-3) == ""


def test_a_draw_that_takes_only_wall_time_is_flagged_by_the_wall_clock():
    """Helpers that compute while the inputs are drawn and exit before the reply take their CPU time with them."""
    rng = random.Random(2)
    found = slower_outside_calls(_blocks(rng, 2e-3, 2e-3), _blocks(rng, 2e-3, 20e-3))
    assert found.startswith("drawing the inputs") and "by the wall clock" in found


def test_a_digest_that_takes_only_wall_time_is_flagged():
    rng = random.Random(3)
    found = slower_outside_calls(_blocks(rng, 2e-3, 2e-3), _blocks(rng, 2e-3, 2e-3, digest_wall_s=20e-3))
    assert found.startswith("the output digest") and "by the wall clock" in found


def test_a_flag_names_every_steps_medians_on_both_sides():
    """So that a flagged honest candidate (a CI machine's) can be read back to the step and clock that raised it."""
    rng = random.Random(3)
    found = slower_outside_calls(_blocks(rng, 2e-3, 2e-3), _blocks(rng, 2e-3, 2e-3, digest_wall_s=20e-3))
    breakdown = found.split("candidate / reference medians in ms: ")[1]
    digest_wall = breakdown.split("digest, wall ")[1].split(";")[0]
    ours, theirs = (float(v) for v in digest_wall.split(" / "))
    assert 18 < ours < 22 and 0.9 < theirs < 1.1
    assert "draw off the CPU" in breakdown and "beyond them, judge's clock" in breakdown


def test_a_wall_clock_slower_within_the_slack_is_not_flagged():
    """A busy machine stretches one side's steps a little (5 %), not a flag."""
    rng = random.Random(4)
    assert slower_outside_calls(_blocks(rng, 2e-3, 2e-3), _blocks(rng, 2e-3, 2.1e-3)) == ""


def test_a_draw_slow_in_just_over_half_of_few_blocks_is_flagged():
    """11 of 20 blocks set the median (the speedup) with the ranks of all pairs below z 3.09; the candidate's 11
    slowest draws, all slower than any of the reference's, are not chance."""
    rng = random.Random(5)
    candidate = _blocks(rng, 2e-3, 20e-3, count=11) + _blocks(rng, 2e-3, 2e-3, count=9)
    found = slower_outside_calls(_blocks(rng, 2e-3, 2e-3), candidate)
    assert found.startswith("drawing the inputs") and "in its 11 slowest of 20 blocks" in found, found


def test_a_few_slow_blocks_of_either_side_are_chance():
    """Same-distribution steps with a heavy tail (a burst of load now and then, on either side): flagged in about
    one round in a thousand, not more (the slowest-blocks test alone allows p = 0.001 per step and clock)."""
    rng = random.Random(6)

    def loaded(count: int) -> list[Block]:
        blocks = _blocks(rng, 2e-3, 2e-3, count=count)
        for block in blocks:
            if rng.random() < 0.1:
                block.drawn_wall_s *= rng.uniform(2, 20)
        return blocks

    flagged = sum(bool(slower_outside_calls(loaded(20), loaded(20))) for _ in range(2000))
    assert flagged <= 10, flagged


def test_hiccups_below_a_quarter_of_a_block_in_some_blocks_are_not_flagged():
    """An honest candidate's draw can be slower in some blocks (an allocation the reference's process did not need):
    9 of 20 in a row at the top come by chance once in 1,600, but work that small (under a quarter of the 8 ms
    block), moved out of the calls, buys no more than the room a report has anyway."""
    rng = random.Random(7)
    candidate = _blocks(rng, 2e-3, 3.5e-3, count=9) + _blocks(rng, 2e-3, 2e-3, count=11)
    assert slower_outside_calls(_blocks(rng, 2e-3, 2e-3), candidate) == ""


def test_work_split_between_the_draw_and_the_digest_is_flagged():
    """6 blocks slow in the draw and 5 others in the digest: too few of either alone (chance gives 6 of 20 in a row
    at the top once in 100), 11 together."""
    rng = random.Random(8)
    candidate = (
        _blocks(rng, 2e-3, 20e-3, count=6)
        + _blocks(rng, 2e-3, 2e-3, digest_wall_s=20e-3, count=5)
        + _blocks(rng, 2e-3, 2e-3, count=9)
    )
    found = slower_outside_calls(_blocks(rng, 2e-3, 2e-3), candidate)
    assert found.startswith("drawing the inputs (off the CPU) and the digest together"), found


def test_work_split_between_the_draw_and_the_time_after_the_calls_is_flagged():
    """A red-team candidate: 8 of 20 blocks computed in the draw, 8 others after the timed calls returned (helpers
    that exit before the reply: only the wall clock sees either), 4 honest. 8 of 20 at the top come by chance once in
    600 for each test alone; 16 of all the time around the calls do not."""
    rng = random.Random(9)
    candidate = (
        _blocks(rng, 2e-3, 20e-3, count=8)
        + _blocks(rng, 2e-3, 2e-3, wall_s=28e-3, count=8)
        + _blocks(rng, 2e-3, 2e-3, count=4)
    )
    found = slower_outside_calls(_blocks(rng, 2e-3, 2e-3), candidate)
    assert found.startswith("all the time around the timed calls"), found


def _timed(rng: random.Random, call_ms: float, drawn_s: float, drawn_wall_s: float, count: int = 20) -> list[Block]:
    """Blocks of 8 calls of `call_ms` each (reported), 10 % noise on every step; the judge's clock and the wall
    clock see 0.2 ms around the calls."""
    blocks = _blocks(rng, drawn_s, drawn_wall_s, count=count)
    for block in blocks:
        block.ms = [call_ms * rng.uniform(0.95, 1.05)] * 8
        block.clocked_s = block.wall_s = sum(block.ms) / 1e3 + 0.2e-3
    return blocks


def _charged_median(reference: list[Block], candidate: list[Block]) -> float:
    return statistics.median(charged_outside_calls(reference, candidate, [b.per_call_ms for b in candidate]))


def test_work_moved_into_every_draw_is_charged_back():
    """1 ms of each 1 ms call computed while the inputs were drawn (8 ms a block): the samples are the calls' again."""
    rng = random.Random(11)
    reference = _timed(rng, 1.0, 2e-3, 2e-3)
    moved = _timed(rng, 0.0, 10e-3, 10e-3)
    assert 0.9 < _charged_median(reference, moved) < 1.1


def test_work_moved_into_just_over_half_of_the_draws_is_charged_to_those_blocks():
    """The median of the reported samples is the moved blocks'; charged block by block, it is the calls' again."""
    rng = random.Random(12)
    reference = _timed(rng, 1.0, 2e-3, 2e-3)
    candidate = _timed(rng, 0.0, 10e-3, 10e-3, count=11) + _timed(rng, 1.0, 2e-3, 2e-3, count=9)
    assert statistics.median(b.per_call_ms for b in candidate) < 0.1
    assert 0.9 < _charged_median(reference, candidate) < 1.1


def test_work_split_between_a_thread_beside_the_draw_and_helpers_that_exit_is_seen():
    """A red-team candidate: in 10 blocks a thread beside the draw computes the answers (CPU time only: the draw runs
    on one core: charged), in the 10 others helpers that exit before the reply do (wall time only). The draw's 10
    slowest blocks, by either clock, come by chance once in 5,000."""
    rng = random.Random(16)
    reference = _timed(rng, 1.0, 2e-3, 2e-3)
    candidate = _timed(rng, 0.8, 3.6e-3, 2e-3, count=10) + _timed(rng, 0.0, 2e-3, 10e-3, count=10)
    rng.shuffle(candidate)
    found = slower_outside_calls(reference, candidate)
    assert found.startswith("drawing the inputs") and "in its 10 slowest" in found, found


def test_the_digest_is_not_charged():
    """Its time varies between two processes of identical code far more than the draw's; the flag holds it."""
    rng = random.Random(18)
    reference = _timed(rng, 1.0, 2e-3, 2e-3)
    candidate = _timed(rng, 1.0, 2e-3, 2e-3)
    for block in candidate:
        block.digest_s = block.digest_wall_s = 3e-3  # 0.25 ms a call more, a quarter of the call, if charged
    assert _charged_median(reference, candidate) < 1.05 * statistics.median(b.per_call_ms for b in candidate)


def test_a_thread_beside_the_draw_is_charged_its_whole_cpu_time():
    """On a CPU the judge's clock is divided by the worker's torch threads (8 here); the draw runs on one of them,
    so the 8 ms a thread beside it computed show as 1 ms on that clock."""
    rng = random.Random(17)
    reference = _timed(rng, 1.0, 2e-3 / 8, 2e-3)
    beside = _timed(rng, 0.0, 10e-3 / 8, 2e-3)
    for block in reference + beside:
        block.digest_s /= 8
    charged = charged_outside_calls(reference, beside, [b.per_call_ms for b in beside], threads=8)
    assert 0.9 < statistics.median(charged) < 1.1


def test_work_moved_into_exactly_half_of_ten_blocks_is_charged():
    """A red-team candidate moved its whole call into the draw of every second block: with 10 blocks a round the
    median is the mean of the 5th and 6th samples, half its honest time, while its draws rank at z 1.1, under the
    gate (it scored 2.0-5.6x). Each of those blocks is slower than every reference draw, and is charged."""
    rng = random.Random(20)
    reference = _timed(rng, 1.0, 2e-3, 2e-3, count=10)
    candidate = [
        block
        for _ in range(5)
        for block in (_timed(rng, 0.0, 10e-3, 10e-3, count=1)[0], _timed(rng, 1.0, 2e-3, 2e-3, count=1)[0])
    ]
    assert statistics.median(b.per_call_ms for b in candidate) < 0.6
    assert 0.9 < _charged_median(reference, candidate) < 1.1


def test_work_moved_into_the_draws_that_set_the_median_is_charged_whatever_the_other_draws_are():
    """A red-team simulation: in 9 of 20 blocks the candidate's draw does nothing and its timed calls draw their own
    inputs (slow samples, above the median); in the other 11 it moves 40 % of each call into the draw. Its 20 draws
    rank near chance, so they were charged only beyond the reference's slowest draw, and the median credited what
    that draw is slower than a typical one (1.5x here); the 11 draws that set the median rank beyond chance."""
    rng = random.Random(21)
    reference = _timed(rng, 1.0, 32e-3, 32e-3)
    moved = _timed(rng, 0.6, 35.2e-3, 35.2e-3, count=11)
    skipped = _timed(rng, 5.0, 0.1e-3, 0.1e-3, count=9)
    candidate = moved + skipped
    rng.shuffle(candidate)
    assert statistics.median(b.per_call_ms for b in candidate) < 0.7
    assert 0.9 < _charged_median(reference, candidate) < 1.1


def test_faster_draws_earn_no_credit():
    rng = random.Random(14)
    reference = _timed(rng, 1.0, 4e-3, 4e-3)
    candidate = _timed(rng, 1.0, 2e-3, 2e-3)
    assert _charged_median(reference, candidate) == statistics.median(b.per_call_ms for b in candidate)


def test_the_same_steps_cost_an_honest_candidate_little():
    """Draws with the reference's distribution, twice as long as the calls (16 ms draws, 8 ms of calls a block, 10 %
    noise on each): chance is charged only where the candidate's draws rank above the reference's beyond it, about
    0.4 % of the time on average here (2 % were every block's excess charged)."""
    rng = random.Random(15)
    charged = [_charged_median(_timed(rng, 1.0, 16e-3, 16e-3), _timed(rng, 1.0, 16e-3, 16e-3)) for _ in range(200)]
    assert statistics.mean(charged) < 1.01, statistics.mean(charged)
