"""Returns, advantages and the clipped loss against hand-computed values; masking of padding and left-out samples."""

from __future__ import annotations

import math

import pytest
import torch

from services.trainer.config import TrainConfig
from services.trainer.episodes import Turn
from services.trainer.grpo import (
    STD_EPS,
    assign_returns_and_advantages,
    discounted_returns,
    group_advantages,
    grpo_loss,
    mini_batches,
    optimizer_steps,
    rollout_metrics,
    select_problems,
)
from services.trainer.processes import equalise_steps


def test_discounted_returns_by_hand():
    assert discounted_returns([1.0, -1.0, 2.0], 0.5) == pytest.approx([1.0 - 0.5 + 0.5, -1.0 + 1.0, 2.0])
    assert discounted_returns([1.0, 2.0], 0.0) == [1.0, 2.0]
    assert discounted_returns([1.0, 1.0, 1.0], 1.0) == [3.0, 2.0, 1.0]


def test_left_out_turn_is_skipped_in_earlier_returns():
    # the evaluator failed at turn 1: the state stayed on the same kernel, so turn 2 follows turn 0 directly; a
    # reward of 0 in its place would pull turn 0's return towards 0 for the services' failure
    returns = discounted_returns([1.0, None, 4.0], 0.5)
    assert returns[0] == pytest.approx(1.0 + 0.5 * 4.0) and returns[1] is None and returns[2] == 4.0
    assert discounted_returns([None, None], 0.5) == [None, None]


def test_std_floor_keeps_timing_noise_small():
    noise = [1.30, 1.32, 1.28, 1.30]  # four correct kernels within 3 % of each other
    plain = group_advantages(noise, [0] * 4, scale_rewards=True)
    floored = group_advantages(noise, [0] * 4, scale_rewards=True, std_floor=0.2)
    assert max(plain) == pytest.approx(1.22, abs=0.01)  # noise made a full-size advantage
    assert max(floored) < 0.11
    signal = [1.3, 1.3, -1.0, -0.5]  # a real spread is above the floor: unchanged
    assert group_advantages(signal, [0] * 4, True, std_floor=0.2) == group_advantages(signal, [0] * 4, True)


def test_group_advantages_use_unbiased_std_per_group():
    returns = [1.0, 3.0, 10.0, 10.0, 10.0]
    adv = group_advantages(returns, ["a", "a", "b", "b", "b"], scale_rewards=True)
    std_a = math.sqrt(((1 - 2) ** 2 + (3 - 2) ** 2) / 1)  # unbiased
    assert adv[:2] == pytest.approx([-1 / (std_a + STD_EPS), 1 / (std_a + STD_EPS)])
    assert adv[2:] == [0.0, 0.0, 0.0]  # no spread, no signal


def test_group_advantages_without_std_scaling_only_centre():
    assert group_advantages([1.0, 3.0, 8.0], [0, 0, 0], scale_rewards=False) == pytest.approx([-3.0, -1.0, 4.0])


def test_group_of_one_gets_zero_advantage():
    assert group_advantages([5.0], ["only"], scale_rewards=True) == [0.0]


def _turn(group: int, trajectory: int, turn: int, reward: float | None) -> Turn:
    return Turn(
        problem_id=f"p{group}",
        group=group,
        trajectory=trajectory,
        turn=turn,
        prompt_ids=[1],
        completion_ids=[2],
        suggestion="s",
        finished=True,
        reward=reward,
    )


def test_assign_group_and_per_turn_scopes():
    # problem 0: two trajectories of two turns; trajectory 1's second turn was left out (upstream error)
    turns = [_turn(0, 0, 0, 1.0), _turn(0, 0, 1, 2.0), _turn(0, 1, 0, -1.0), _turn(0, 1, 1, None)]
    config = TrainConfig(gamma=0.5, num_trajectories=2, scale_rewards=False)
    samples = assign_returns_and_advantages(turns, config)
    assert [t.ret for t in turns] == pytest.approx([2.0, 2.0, -1.0, 0.0])
    assert samples == turns[:3]  # the left-out turn is not a sample
    mean = (2.0 + 2.0 - 1.0) / 3
    assert [t.advantage for t in samples] == pytest.approx([2.0 - mean, 2.0 - mean, -1.0 - mean])
    assert turns[3].advantage == 0.0

    per_turn = TrainConfig(gamma=0.5, num_trajectories=2, scale_rewards=False, advantage_scope="group_per_turn")
    samples = assign_returns_and_advantages(turns, per_turn)
    assert [t.advantage for t in samples] == pytest.approx([1.5, 0.0, -1.5])  # turn 0: {2, -1}; turn 1: {2}


def test_same_kernel_every_turn_has_no_advantage_per_turn_index():
    # both trajectories wrote the same kernel at both turns (shared verdict, reward 1.2 each): with gamma 0.4 the
    # turn-0 returns are 1.68 and the turn-1 returns 1.2, so over the whole group turn 0 gains and turn 1 loses
    turns = [_turn(0, j, t, 1.2) for j in range(2) for t in range(2)]
    group = TrainConfig(gamma=0.4, num_trajectories=2)
    samples = assign_returns_and_advantages(turns, group)
    assert [t.advantage > 0 for t in samples] == [True, False, True, False]
    assert rollout_metrics(turns, samples, group)["reward/frac_zero_std_groups"] == 0.0

    per_turn = TrainConfig(gamma=0.4, num_trajectories=2, advantage_scope="group_per_turn")
    samples = assign_returns_and_advantages(turns, per_turn)
    assert [t.advantage for t in samples] == [0.0] * 4
    assert rollout_metrics(turns, samples, per_turn)["reward/frac_zero_std_groups"] == 1.0


def test_loss_by_hand_token_level_with_clipping_and_kl():
    logps = torch.tensor([[math.log(0.5), math.log(0.9)], [math.log(0.2), 0.0]])
    old = torch.tensor([[math.log(0.25), math.log(0.9)], [math.log(0.4), 0.0]])
    ref = torch.tensor([[math.log(0.5), math.log(0.45)], [math.log(0.2), 0.0]])
    adv = torch.tensor([1.0, -2.0])
    mask = torch.tensor([[1, 1], [1, 0]])  # the second completion has one token, then padding
    loss, stats = grpo_loss(logps, old, ref, adv, mask, 0.2, 0.2, 0.1, "token", normalizer=3.0)
    # ratios: 2.0 (clipped to 1.2 for A>0), 1.0, 0.5 (A<0: max(-A*r, -A*clip) = max(1.0, 1.6) = 1.6)
    pg = [-1.2, -1.0, 1.6]
    k3 = [0.0, 0.5 - math.log(0.5) - 1, 0.0]  # exp(ref - logp) - (ref - logp) - 1 with ref/p = 0.5
    expected = sum(p + 0.1 * k for p, k in zip(pg, k3, strict=True)) / 3.0
    assert loss.item() == pytest.approx(expected, rel=1e-5)
    assert stats["clip_ratio"].item() == pytest.approx(2 / 3)
    assert stats["kl"].item() == pytest.approx(sum(k3) / 3, rel=1e-5)


def test_sequence_normalisation_is_mean_of_per_completion_means():
    logps = torch.zeros(2, 3)
    adv = torch.tensor([1.0, 2.0])
    mask = torch.tensor([[1, 1, 1], [1, 0, 0]])
    token, _ = grpo_loss(logps, logps, None, adv, mask, 0.2, 0.2, 0.0, "token", normalizer=4.0)
    sequence, _ = grpo_loss(logps, logps, None, adv, mask, 0.2, 0.2, 0.0, "sequence", normalizer=2.0)
    assert token.item() == pytest.approx(-(1 + 1 + 1 + 2) / 4)
    assert sequence.item() == pytest.approx(-(1 + 2) / 2)


def test_padding_does_not_reach_the_loss_or_gradient():
    logps = torch.tensor([[-1.0, -2.0, 123.0]], requires_grad=True)
    old = torch.tensor([[-1.0, -2.0, -50.0]])
    loss, _ = grpo_loss(logps, old, None, torch.tensor([1.0]), torch.tensor([[1, 1, 0]]), 0.2, 0.2, 0.0, "token", 2.0)
    loss.backward()
    assert torch.isfinite(loss)
    assert logps.grad[0, 2].item() == 0.0


def test_accumulated_mini_batches_equal_one_batch():
    torch.manual_seed(0)
    logps = torch.randn(4, 5) * 0.1 - 1
    old = logps + torch.randn(4, 5) * 0.05
    ref = logps + torch.randn(4, 5) * 0.05
    adv = torch.randn(4)
    mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 0, 0, 0], [1, 1, 1, 0, 0], [1, 0, 0, 0, 0]])
    for norm, n in (("token", float(mask.sum())), ("sequence", 4.0)):
        whole, _ = grpo_loss(logps, old, ref, adv, mask, 0.2, 0.28, 0.04, norm, n)
        parts = sum(
            grpo_loss(
                logps[i : i + 2],
                old[i : i + 2],
                ref[i : i + 2],
                adv[i : i + 2],
                mask[i : i + 2],
                0.2,
                0.28,
                0.04,
                norm,
                n,
            )[0]
            for i in (0, 2)
        )
        assert parts.item() == pytest.approx(whole.item(), rel=1e-6)


def test_optimizer_steps_cover_every_sample_once():
    config = TrainConfig(mini_batch_size=3, gradient_accumulation_steps=2)
    generator = torch.Generator().manual_seed(0)
    minis = mini_batches(10, config, generator)
    steps = optimizer_steps(minis, config, generator)
    flat = [i for step in steps for mini in step for i in mini]
    assert sorted(flat) == list(range(10))
    assert [len(step) for step in steps] == [2, 2]
    assert all(len(mini) <= 3 for step in steps for mini in step)
    again = optimizer_steps(minis, config, generator)  # the next epoch: the same mini-batches, another order
    assert sorted(mini for step in again for mini in step) == sorted(minis) and again != steps


class TwoProcesses:
    """accelerate's gather, as seen from one of two processes whose partner reports `other`."""

    num_processes, device = 2, "cpu"

    def __init__(self, other: list[int]) -> None:
        self.other = other

    def gather(self, tensor: torch.Tensor) -> torch.Tensor:
        return torch.cat([tensor, torch.tensor([self.other])])


def test_processes_run_the_same_number_of_backward_passes_per_step():
    config = TrainConfig(mini_batch_size=2, gradient_accumulation_steps=4)
    generator = torch.Generator().manual_seed(0)
    mine = optimizer_steps(mini_batches(14, config, generator), config, generator)  # 7 mini-batches: steps of 4, 3
    assert [len(step) for step in mine] == [4, 3]
    padded = equalise_steps(mine, TwoProcesses(other=[3, 4]))  # the partner: 3 steps of up to 4 mini-batches
    assert [len(step) for step in padded] == [4, 4, 4]
    assert sorted(i for step in padded for mini in step for i in mini) == list(range(14))  # nothing lost or added
    assert sum(not mini for step in padded for mini in step) == 12 - 7
    assert equalise_steps(mine, None) == mine


def test_problem_selection_is_a_function_of_seed_and_update():
    problems = list("abcde")
    first = [select_problems(problems, u, 2, seed=1) for u in range(5)]
    assert first == [select_problems(problems, u, 2, seed=1) for u in range(5)]
    seen = [p for chosen in first[:2] for p in chosen] + [select_problems(problems, 2, 2, seed=1)[0]]
    assert sorted(seen) == problems  # each epoch visits every problem once
