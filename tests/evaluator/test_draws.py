"""A timed block's inputs (runner.InputSets): drawn from the judge's seeds, one set per call, the same in every
worker that draws the same seeds."""

from __future__ import annotations

import random
import types

import numpy as np
import torch

from services.evaluator.backends import get_backend
from services.evaluator.runner import InputSets


def _get_inputs() -> list:
    """A problem whose inputs take Python's and numpy's generators as well as torch's."""
    return [torch.randn(4) + random.random(), torch.from_numpy(np.random.rand(4))]


def _draw(seeds: list[int]) -> list[list[torch.Tensor]]:
    sets = InputSets(types.SimpleNamespace(backend=get_backend("cpu")), _get_inputs)
    sets.draw_all(seeds)
    return sets.drawn


def test_two_workers_drawing_the_same_seeds_draw_the_same_inputs():
    first = _draw([11, 12, 13])
    random.seed(999)  # whatever state the other process's generators are in
    np.random.seed(999)
    torch.manual_seed(999)
    second = _draw([11, 12, 13])
    for ours, theirs in zip(first, second, strict=True):
        assert all(torch.equal(a, b) for a, b in zip(ours, theirs, strict=True))


def test_every_call_of_a_block_draws_other_inputs_from_every_generator():
    drawn = _draw([11, 12, 13])
    for index, tensor in enumerate(drawn[0]):
        assert not torch.equal(tensor, drawn[1][index]) and not torch.equal(tensor, drawn[2][index])


def test_pythons_and_numpys_generators_are_seeded_once_a_block(monkeypatch):  # noqa: ANN001
    """Seeding them costs about 6 us a call, which a candidate's own draw could skip and spend on its answers."""
    seeded: list[int] = []
    seed = random.seed
    monkeypatch.setattr(random, "seed", lambda value=None: (seeded.append(value), seed(value))[1])
    _draw([11, 12, 13, 14])
    assert seeded == [11]
