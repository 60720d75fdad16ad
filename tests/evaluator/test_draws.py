"""A timed block's inputs (runner.InputSets): drawn from the judge's seeds, one set per call, the same in every
worker that draws the same seeds."""

from __future__ import annotations

import random
import time
import types
import weakref
from typing import Any

import numpy as np
import pytest
import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

from services.evaluator import gpu_checks, output_digest, runner
from services.evaluator.backends import get_backend
from services.evaluator.guards import Guard
from services.evaluator.runner import InputSets, _reused_by_later_calls, serve_timing

# The runner's own copies are tested on each device they take: memmove on a CPU, the CUDA driver's copy on a GPU.
DEVICES = [
    "cpu",
    pytest.param(
        "cuda", marks=[pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]
    ),
]


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


class _ScriptedContext:
    """What serve_timing reads and writes of a worker's context: the judge's commands, in order, and its events."""

    def __init__(self, commands: list[dict[str, Any]], device: str = "cpu") -> None:
        self.backend = get_backend(device)
        self.commands = iter(commands)
        self.events: list[dict[str, Any]] = []
        self.made: list[weakref.ref[torch.Tensor]] = []  # every set drawn and every output, in order
        self.made_before_draw = 0

    def command(self) -> dict[str, Any]:
        command = next(self.commands)
        if command["op"] == "draw":
            self.made_before_draw = len(self.made)
        return command

    def emit(self, event: str, **fields: Any) -> None:
        self.events.append({"event": event, **fields})

    def pin_threads(self) -> None:
        pass


def test_a_worker_holds_no_earlier_blocks_inputs_or_outputs_while_it_draws():
    """A timed block's sets and outputs take most of a GPU's memory on the largest problems (KernelBench level 1 has
    7-8 GiB inputs): one more set or output held while the next block is drawn ran an honest candidate out of
    memory on an H100, a runtime_error against it."""
    earlier_alive: list[int] = []  # at each draw, how many of those made before its block's draw began are alive

    def get_inputs() -> list[torch.Tensor]:
        earlier_alive.append(sum(ref() is not None for ref in context.made[: context.made_before_draw]))
        drawn = torch.randn(64)
        context.made.append(weakref.ref(drawn))
        return [drawn]

    def model(x: torch.Tensor) -> torch.Tensor:
        out = x * 2
        context.made.append(weakref.ref(out))
        return out

    block: list[dict[str, Any]] = [{"op": "draw", "seeds": [1, 2], "nonce": "d"}, {"op": "block", "nonce": "b"}]
    digest = {"op": "digest", "seed": 7, "nonce": "g"}
    context = _ScriptedContext([*block, digest, *block, digest, *block, {"op": "exit"}])
    serve_timing(context, model, InputSets(context, get_inputs), Guard())  # type: ignore[arg-type]
    assert [e["event"] for e in context.events] == ["drawn", "block", "digested"] * 2 + ["drawn", "block", "done"]
    assert earlier_alive == [0] * 6


def _block_replies(model: Any, calls: int, copy: bool, device: str = "cpu") -> list[dict[str, Any]]:
    """The `block` reply to one block of `calls` calls, each output copied as its call returns where `copy`."""
    block = [{"op": "draw", "seeds": list(range(calls)), "nonce": "d"}, {"op": "block", "nonce": "b", "copy": copy}]
    context = _ScriptedContext([*block, {"op": "exit"}], device)
    serve_timing(context, model, InputSets(context, lambda: [torch.randn(8)]), Guard())  # type: ignore[arg-type]
    return [e for e in context.events if e["event"] == "block"]


def test_a_block_says_whether_its_outputs_share_memory_a_later_call_writes_again():
    """A model that returns one buffer it keeps leaves the last call's answer in every output of a block; the judge
    then has each output copied as its call returns (Judge.copy_outputs), and the copies share nothing. Slices of
    one storage, one per call, share no bytes, and a view of a call's own inputs is its own: every call has a set of
    its own."""
    kept = torch.zeros(8)

    def into_kept(x: torch.Tensor) -> torch.Tensor:
        return torch.mul(x, 2, out=kept)

    def view_of_input(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return x * 2, x[:4]

    def fresh(x: torch.Tensor) -> torch.Tensor:
        return x * 2

    slots, calls = torch.zeros(3, 8), [0]  # one storage, a slice of it per call

    def own_slot(x: torch.Tensor) -> torch.Tensor:
        calls[0] += 1
        return torch.mul(x, 2, out=slots[calls[0] - 1])

    assert _block_replies(into_kept, 2, copy=False)[0]["aliased"] is True
    assert _block_replies(view_of_input, 3, copy=False)[0]["aliased"] is False
    assert _block_replies(fresh, 3, copy=False)[0]["aliased"] is False
    assert _block_replies(own_slot, 3, copy=False)[0]["aliased"] is False
    for model in (into_kept, view_of_input):
        reply = _block_replies(model, 3, copy=True)[0]
        assert reply["aliased"] is False
        assert len({region[0] for call in reply["regions"] for region in call}) == 3 * len(reply["regions"][0])


def test_memory_a_later_call_writes_again_is_found_by_byte_ranges():
    """Against every pair of ranges, on slices of one storage: outputs of several tensors each, overlapping within a
    call (allowed) or across calls (found)."""
    base, rng = torch.zeros(400), random.Random(5)

    def piece() -> torch.Tensor:
        start = rng.randrange(390)
        return base[start : start + rng.randrange(1, 60)]

    for _ in range(300):
        outputs = [tuple(piece() for _ in range(rng.randrange(1, 4))) for _ in range(rng.randrange(1, 6))]
        groups = [list(out) for out in outputs]
        spans = [[(t.data_ptr(), t.data_ptr() + t.numel() * 4) for t in group] for group in groups]
        expected = any(
            a < d and c < b
            for i, ours in enumerate(spans)
            for theirs in spans[i + 1 :]
            for a, b in ours
            for c, d in theirs
        )
        assert _reused_by_later_calls(outputs) is expected, (spans, expected)


class _Recorder(TorchFunctionMode):
    """Every torch function a worker's code calls while it is pushed, as a candidate's mode would see them."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[str] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204
        self.seen.append(getattr(func, "__name__", str(func)))
        return func(*args, **(kwargs or {}))


class _DispatchRecorder(TorchDispatchMode):
    """Every aten operator run while it is pushed, as a candidate's dispatch mode would see them."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204
        self.seen.append(str(func))
        return func(*args, **(kwargs or {}))


def test_the_runners_checks_and_copies_run_no_mode_of_the_candidates():
    """A mode the candidate pushed saw the inputs' refills and the outputs' copies, steps outside its calls: a
    red-team candidate computed half of each answer in the copy (docs/evaluator.md). Its own calls still run under
    it."""
    kept = torch.zeros(8)

    def into_kept(x: torch.Tensor) -> torch.Tensor:
        return torch.mul(x, 2, out=kept)

    functions, operators = _Recorder(), _DispatchRecorder()
    with functions, operators:
        _block_replies(into_kept, 3, copy=True)
    assert "mul" in functions.seen and "aten.mul.out" in operators.seen  # the candidate's own calls
    assert not {"clone", "copy_"} & set(functions.seen), functions.seen
    assert not [op for op in operators.seen if "clone" in op or "copy" in op], operators.seen


def test_the_layout_of_a_non_dense_output_runs_no_mode_of_the_candidates():
    """The runner lays a strided output out after the block's calls (runner._as_laid_out): a red-team candidate's
    mode did its whole matmul there, outside the timed calls (docs/evaluator.md)."""

    def every_other(x: torch.Tensor) -> torch.Tensor:
        return torch.mul(x, 2)[::2]

    functions, operators = _Recorder(), _DispatchRecorder()
    with functions, operators:
        reply = _block_replies(every_other, 3, copy=False)[0]
    assert "mul" in functions.seen and "aten.mul.Tensor" in operators.seen  # the candidate's own calls
    assert [[nbytes for _, nbytes in call] for call in reply["regions"]] == [[4 * 4]] * 3  # laid out, all the same
    laid_out = {"contiguous", "resolve_conj", "resolve_neg", "clone"}
    assert not laid_out & set(functions.seen), functions.seen
    # Nothing of the runner's steps after the calls either (where an output lies, whether it is reused, its shape
    # for the next re-check): a red-team candidate's mode did the work it had deferred past its calls in the first
    # of them. What it sees is the draw (randn, moved to the device) and the switch of autograd around the block.
    assert set(functions.seen) <= {"mul", "__getitem__", "randn", "to", "_set_grad_enabled"}, functions.seen
    assert not [op for op in operators.seen if "clone" in op or "copy" in op], operators.seen


@pytest.mark.parametrize(
    "strided",
    [
        torch.randn(8, 6)[:, :4],
        torch.randn(4, 6).t()[::2],
        torch.randn(5).expand(3, 5),
        torch.arange(24, dtype=torch.int16).reshape(2, 3, 4)[:, 1:, ::3],
        torch.randn(6, 4, dtype=torch.bfloat16)[::2],
        torch.randn(3, 3, dtype=torch.complex64)[:, ::2],
        torch.randn(4, 4).as_strided((3, 3), (1, 2)),
        torch.randn(0, 3)[:, :2],
    ],
    ids=["slice", "transposed_slice", "expanded", "int16", "bfloat16", "complex", "overlapping", "empty"],
)
def test_a_non_dense_output_is_laid_out_with_its_values(strided: torch.Tensor):
    laid_out = runner._as_laid_out(strided)
    assert laid_out.is_contiguous() and laid_out.dtype == strided.dtype and torch.equal(laid_out, strided)
    assert strided.numel() == 0 or laid_out.data_ptr() != strided.data_ptr()


def test_the_layout_of_a_non_dense_output_runs_no_kernel_the_candidate_registers():
    """On a CPU a strided output is gathered by numpy (runner._dense_copy_of), not by torch's `.contiguous()`,
    whose clone runs whatever kernel is registered for it, after the block's calls."""
    seen: list[str] = []

    def clone(tensor: torch.Tensor, memory_format: Any = None) -> torch.Tensor:
        seen.append("clone")
        with torch._C._AutoDispatchBelowAutograd():
            return torch.ops.aten.clone.default(tensor, memory_format=memory_format)

    library = torch.library.Library("aten", "IMPL")
    try:
        library.impl("clone", clone, "AutogradCPU")
        torch.zeros(4, 2)[:, :1].contiguous()
        assert seen == ["clone"]  # the kernel runs where the runner does not keep it out
        seen.clear()
        reply = _block_replies(lambda x: torch.mul(x, 2)[::2], 3, copy=False)[0]
    finally:
        library._destroy()
    assert seen == []
    assert [[nbytes for _, nbytes in call] for call in reply["regions"]] == [[4 * 4]] * 3  # laid out, all the same


@pytest.mark.parametrize("device", DEVICES)
def test_the_runners_copies_run_no_kernel_the_candidate_registers(device: str):
    """torch's copy and clone run whatever kernel is registered for them, and no switch turns that off: red-team
    candidates computed answers in their own kernels for both (docs/evaluator.md)."""
    seen: list[str] = []

    def clone(tensor: torch.Tensor, memory_format: Any = None) -> torch.Tensor:
        seen.append("clone")
        with torch._C._AutoDispatchBelowAutograd():
            return torch.ops.aten.clone.default(tensor, memory_format=memory_format)

    def copy(destination: torch.Tensor, source: torch.Tensor, non_blocking: bool = False) -> torch.Tensor:
        seen.append("copy_")
        with torch._C._AutoDispatchBelowAutograd():
            return torch.ops.aten.copy_.default(destination, source, non_blocking)

    kept = torch.zeros(8, device=device)
    dispatch_key = "AutogradCUDA" if device == "cuda" else "AutogradCPU"
    # A worker compiles (and tests) the device hash of the block's sketches before any candidate code runs.
    output_digest.prepare(device)
    library = torch.library.Library("aten", "IMPL")
    try:
        library.impl("clone", clone, dispatch_key)
        library.impl("copy_", copy, dispatch_key)
        torch.zeros(2, device=device).clone()
        assert seen == ["clone"]  # the kernel runs where the runner does not keep it out
        seen.clear()
        reply = _block_replies(lambda x: torch.mul(x, 2, out=kept), 3, copy=True, device=device)[0]
    finally:
        library._destroy()
    assert seen == [] and reply["aliased"] is False


@pytest.mark.parametrize("device", DEVICES)
def test_a_copy_keeps_the_values_and_layout_of_any_tensor(device: str):
    base = torch.arange(60, dtype=torch.float64, device=device).reshape(3, 4, 5)
    tensors = [
        base,
        base.transpose(0, 2),
        base[:, 1:3, ::2],
        base[1],
        torch.arange(4, device=device).expand(3, 4),
        torch.tensor([True, False, True], device=device),
        torch.randn(3, 2, dtype=torch.complex64, device=device).t(),
        torch.empty(0, 3, device=device),
    ]
    for tensor in tensors:
        copy = runner._copy_of(tensor)
        assert copy.device == tensor.device
        assert copy.shape == tensor.shape and copy.stride() == tensor.stride() and copy.dtype == tensor.dtype
        assert torch.equal(copy, tensor)
        assert tensor.numel() == 0 or copy.data_ptr() != tensor.data_ptr()


class _Drawn(torch.Tensor):
    """A draw the candidate's own code made a subclass of (a torch function mode left pushed at its import)."""


def test_a_call_takes_its_set_as_plain_tensors_over_the_drawn_memory():
    context = types.SimpleNamespace(backend=get_backend("cpu"), pin_threads=lambda: None)
    sets = InputSets(context, lambda: [torch.randn(4, 6)])
    drawn = [torch.randn(4, 6).as_subclass(_Drawn), 3]
    given, number = sets.checked(drawn)
    assert type(given) is torch.Tensor and given.data_ptr() == drawn[0].data_ptr() and number == 3


@pytest.mark.parametrize("device", DEVICES)
def test_a_block_moves_no_input_between_its_calls(device: str, monkeypatch):  # noqa: ANN001
    """Each call takes the set drawn for it: no step of the runner's between two calls copies inputs, so none is
    there for a candidate to make cheaper than the reference's timer makes it (red-team candidates skipped or shrank
    the copies of the buffers every call was once refilled into, and computed answers in the time saved; one pointed
    the runner's memmove at code of its own). Only the outputs' copies move bytes, when the judge asks for them."""
    moved: list[int] = []
    move_bytes = runner._move_bytes
    monkeypatch.setattr(runner, "_move_bytes", lambda *args: (moved.append(args[2]), move_bytes(*args))[1])
    output_digest.prepare(device)
    given: list[int] = []

    def doubled(x: torch.Tensor) -> torch.Tensor:
        given.append(x.data_ptr())
        return x * 2

    replies = _block_replies(doubled, 3, copy=False, device=device)
    assert moved == [] and len(set(given)) == 3 and replies[0]["aliased"] is False
    _block_replies(doubled, 3, copy=True, device=device)
    assert moved == [8 * 4] * 3  # each output, as its call returns


def test_a_candidates_call_takes_only_sets_of_the_references_kinds():
    """The judge sends the kinds of the reference's input sets: a red-team candidate's draws handed the runner one
    element of each input (its calls took the whole tensors it had kept), when the runner refilled one set of
    buffers before each call and the refills' cost it saved hid work."""
    context = types.SimpleNamespace(backend=get_backend("cpu"), pin_threads=lambda: None)
    kinds = [[["torch.float32", [4, 6]], None], [["torch.float32", [2, 6]], None]]
    sets = InputSets(context, lambda: [torch.randn(4, 6), 3], kinds=kinds)
    sets.checked([torch.randn(4, 6), 3])
    sets.checked([torch.randn(2, 6), 1.5])  # another of the reference's kinds
    for other in ([torch.randn(1), 3], [torch.randn(4, 6, dtype=torch.float64), 3], [torch.randn(4, 6)]):
        with pytest.raises(RuntimeError, match="other shapes, dtypes or devices than the reference's inputs"):
            sets.checked(other)
    # The reference's shape, but one element's memory (a refill into buffers would have moved 4 bytes).
    for sparse in (torch.randn(1, 1).expand(4, 6), torch.randn(8, 6)[::2], torch.randn(30).as_strided((4, 6), (1, 1))):
        with pytest.raises(RuntimeError, match="overlap or leave gaps"):
            sets.checked([sparse, 3])
    if torch.cuda.is_available():
        with pytest.raises(RuntimeError, match="than the reference's inputs"):
            sets.checked([torch.randn(4, 6, device="cuda"), 3])  # another device than the worker's


class _Count(int):
    """An int of the candidate's: its methods are code of its own."""


def test_a_call_takes_tensors_and_numbers_only():
    """Anything else would be an object of the candidate's own in the call (a red-team candidate's mode wrapped its
    draws so, its code running in the call)."""
    context = types.SimpleNamespace(backend=get_backend("cpu"), pin_threads=lambda: None)
    sets = InputSets(context, lambda: [torch.randn(4)])
    assert sets.checked([torch.randn(4), 2, 0.5, True, None, 1j])[1:] == [2, 0.5, True, None, 1j]
    for drawn in ([torch.randn(4), [torch.randn(4)]], [torch.randn(4), _Count(2)], [object()]):
        with pytest.raises(RuntimeError, match="neither a tensor nor a number"):
            sets.checked(drawn)


def test_a_cpu_copy_into_the_outputs_own_memory_is_refused(monkeypatch):  # noqa: ANN001
    """A red-team candidate's kernel for torch.empty handed the copy the output's own memory: a memmove onto itself,
    free, where the reference's copy moved every byte."""
    output = torch.randn(64)
    monkeypatch.setattr(runner, "_empty", lambda count, dtype, device: output.view(torch.uint8)[:count])
    with pytest.raises(RuntimeError, match="memory the output lies in"):
        runner._copy_of(output)


def test_an_outputs_copy_is_timed_with_its_call(monkeypatch):  # noqa: ANN001
    """Outside the call, the copy was time the clocks let go by on both sides alike, which a candidate could fill with
    work in place of part of the copy; within it, any such work is timed."""
    kept, memmove = torch.zeros(8), runner._memmove

    def slow_memmove(destination: int, source: int, count: int) -> int:
        time.sleep(0.02)
        return memmove(destination, source, count)

    monkeypatch.setattr(runner, "_memmove", slow_memmove)
    reply = _block_replies(lambda x: torch.mul(x, 2, out=kept), 3, copy=True)[0]
    assert min(reply["ms"]) >= 20, reply["ms"]


def test_a_block_drawn_signed_has_negative_values_the_same_in_every_worker():
    """Where the reference's output allowed signed correctness trials, the judge has every timed set drawn signed
    too: a candidate right only on non-negative inputs (`return x` on a ReLU with `torch.rand` inputs) would
    otherwise pass the signed trials by computing and score on the timed calls by not."""

    def drawn(signed: bool) -> list[list[Any]]:
        sets = InputSets(types.SimpleNamespace(backend=get_backend("cpu")), lambda: [torch.rand(256), 3])
        sets.draw_all([11, 12], signed)
        return sets.drawn

    for plain, mapped, again in zip(drawn(False), drawn(True), drawn(True), strict=True):
        assert plain[0].min() >= 0 > mapped[0].min() and mapped[1] == 3
        assert torch.equal(mapped[0], plain[0] * 2 - plain[0].max()) and torch.equal(mapped[0], again[0])
    lowest: list[float] = []

    def doubled(x: torch.Tensor) -> torch.Tensor:
        lowest.append(float(x.min()))
        return x * 2

    draw = {"op": "draw", "seeds": [1, 2], "nonce": "d", "signed": True}
    context = _ScriptedContext([draw, {"op": "block", "nonce": "b"}, {"op": "exit"}])
    serve_timing(context, doubled, InputSets(context, lambda: [torch.rand(64)]), Guard())  # type: ignore[arg-type]
    assert len(lowest) == 2 and max(lowest) < 0


def test_a_signed_draw_maps_a_tensor_drawn_just_now_in_place():
    """A copy beside the drawn tensor (with a block's buffers) ran the largest KernelBench problems out of an H100's
    memory; a tensor drawn just now is the caller's alone, so it is mapped where it lies."""
    drawn: list[torch.Tensor] = []

    def get_inputs() -> list:
        drawn.append(torch.rand(1000))
        return [drawn[-1], torch.randn(10), 3]

    unsigned = gpu_checks.device_inputs(get_inputs, 5, "cpu", signed=False)[0].clone()
    signed = gpu_checks.device_inputs(get_inputs, 5, "cpu", signed=True)
    assert signed[0] is drawn[-1]
    assert torch.equal(signed[0], unsigned * 2 - unsigned.max())
    assert signed[0].min() < 0 <= unsigned.min()
    assert signed[2] == 3


def test_a_signed_draw_copies_a_tensor_its_get_inputs_keeps():
    """A `get_inputs` that returns a tensor it keeps (or a view of one) would see it changed by a mapping in place:
    every later draw would differ from the reference's."""
    kept = torch.rand(64, 8)

    def get_inputs() -> list:
        return [kept, kept[:, :4]]

    before = kept.clone()
    gpu_checks.device_inputs(get_inputs, 5, "cpu", signed=False)  # the draw that returned it first
    first = gpu_checks.device_inputs(get_inputs, 5, "cpu", signed=True)
    second = gpu_checks.device_inputs(get_inputs, 5, "cpu", signed=True)
    assert torch.equal(kept, before)
    assert all(torch.equal(a, b) for a, b in zip(first, second, strict=True))
    assert torch.equal(first[0], before * 2 - before.max()) and first[0].min() < 0


def test_a_signed_draw_copies_what_torch_cannot_change_in_place():
    """A leaf that requires grad (a reference may draw its inputs so), and a tensor whose elements share memory."""
    signed = gpu_checks.device_inputs(lambda: [torch.rand(100, requires_grad=True)], 5, "cpu", signed=True)
    assert signed[0].min() < 0
    shared = gpu_checks.device_inputs(lambda: [torch.empty_strided((8,), (0,)).fill_(0.5)], 5, "cpu", signed=True)
    assert torch.equal(shared[0], torch.full((8,), 0.5))  # one value v, mapped to 2v - v


def test_a_signed_draw_keeps_tensors_that_are_already_signed_or_not_finite():
    signed = torch.randn(100)
    with_nan = torch.rand(100)
    with_nan[7] = float("nan")
    kept = gpu_checks.make_signed([signed, with_nan, torch.arange(4)])
    assert kept[0] is signed and kept[1] is with_nan and torch.equal(kept[2], torch.arange(4))
