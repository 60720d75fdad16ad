"""Trusted comparison of candidate outputs with reference outputs: in the service process for the correctness
trials, in the reference's timer (runner.check_saved_output) for the full checks of timed calls.

Outputs arrive as files a worker wrote, and the worker is hostile: everything here treats a file's path, size,
format and contents as the candidate's to choose. Files are opened without following symlinks and refused above a
size the reference outputs justify (`safe_files`), read strictly as an archive torch.save writes (`torch_archive`),
parsed as data only (`torch.load(weights_only=True)`), then checked for shape before any value is looked at: at
most MAX_LEAVES leaves and MAX_DEPTH levels of lists, plain dense CPU tensors only. A candidate whose file fails
any of this is `incorrect`, never an exception in the service; a comparison that outlives its deadline says so
(`timed_out`).
"""

from __future__ import annotations

import io
import math
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import torch

from services.evaluator import torch_archive
from services.evaluator.safe_files import FileTooLargeError, read_file_beneath

# Default tolerances by reference dtype (absolute and relative alike).
TOLERANCES = {torch.float16: 1e-2, torch.bfloat16: 1e-2, torch.float32: 1e-4, torch.float64: 1e-4}
LOW_PRECISION_TOLERANCE = 1e-1

# Most leaves (tensors, numbers, None) one trial's outputs or inputs may have, and deepest nesting of lists.
MAX_LEAVES = 4096
MAX_DEPTH = 16
# Floating outputs are compared this many elements at a time, so float64 copies of a huge output never coexist.
CHUNK_ELEMENTS = 1 << 22
# An output file may be twice the raw size of the reference's outputs and the trial's inputs (it holds outputs
# and inputs_after), plus per-leaf pickle and zip headers, plus this much.
OUTPUT_SLACK_BYTES = 1 << 20
LEAF_OVERHEAD_BYTES = 1024
# An output file's archive: a record per leaf of the outputs and of the inputs after the call, and torch.save's
# half a dozen of its own; a pickle of at most 256 bytes a leaf (a full one costs seconds to check and load);
# objects at most this deep (MAX_DEPTH lists, a tensor's rebuild arguments, the file's dict).
MAX_RECORDS = 2 * MAX_LEAVES + 16
MAX_PICKLE_BYTES = 2 * MAX_LEAVES * 256 + (64 << 10)  # torch.save writes about 75 bytes a leaf (105 at 8 dims)
MAX_PICKLE_NESTING = MAX_DEPTH + 16
# Objects the pickle may reach (a tensor's rebuild arguments are about 40), counting shared ones each time.
MAX_PICKLE_OBJECTS = 2 * MAX_LEAVES * 256
_INT64 = (-(2**63), 2**63 - 1)

TIME_LIMIT_MESSAGE = "comparison exceeded the time limit"


@dataclass
class Comparison:
    correct: bool
    message: str = ""
    max_abs_error: float | None = None
    max_rel_error: float | None = None
    input_mutation: bool = False
    # The deadline passed before every trial was compared (the verdict is a timeout, not `incorrect`).
    timed_out: bool = False


class MalformedDataError(ValueError):
    """Data is not what our runner writes: wrong format, too many leaves, too deep, or a type it never saves."""


class ComparisonTimeoutError(Exception):
    """The deadline given to `compare_trial` passed."""


def _check_archive(handle: BinaryIO, size: int) -> None:
    """Refuse anything torch.load could read differently from how torch.save wrote it (torch_archive), with room
    for the records and pickle of MAX_LEAVES outputs and as many inputs."""
    try:
        torch_archive.check(
            handle,
            size,
            max_records=MAX_RECORDS,
            max_pickle_bytes=MAX_PICKLE_BYTES,
            max_nesting=MAX_PICKLE_NESTING,
            max_objects=MAX_PICKLE_OBJECTS,
        )
    except torch_archive.UnsafeArchiveError as error:
        raise MalformedDataError(str(error)) from error


def load_data(data: bytes) -> Any:
    """Parse a file our runner wrote with torch.save: data only, CPU only, uncompressed zip format only."""
    _check_archive(io.BytesIO(data), len(data))
    return torch.load(io.BytesIO(data), weights_only=True, map_location="cpu")


def load_file(path: Path) -> Any:
    """`load_data` of a file no worker can change (one the service copied), memory-mapped: its tensors are read
    from the page cache as they are compared, never copied whole into the process."""
    with path.open("rb") as handle:
        _check_archive(handle, os.fstat(handle.fileno()).st_size)
    return torch.load(path, weights_only=True, map_location="cpu", mmap=True)


def flatten(value: Any, *, max_leaves: int = MAX_LEAVES, max_depth: int = MAX_DEPTH) -> list[Any]:
    """Leaves of nested lists/tuples in order; Python numbers become 0-d tensors, tensors and None stay.

    Iterative and bounded: more than `max_leaves` leaves, nesting deeper than `max_depth`, or any type our
    runner never writes (dicts, strings, sets, ...) raise MalformedDataError, however the data was built.
    """
    leaves: list[Any] = []
    stack: list[tuple[Iterator[Any], int]] = [(iter((value,)), 0)]
    # Lists are counted too: one empty list reached through a thousand references at each of MAX_DEPTH levels
    # holds no leaf, and would be walked a thousand to the sixteenth times.
    max_lists = 2 * max_leaves + 16
    lists_left = max_lists
    while stack:
        items, depth = stack[-1]
        item: Any = next(items, _END)
        if item is _END:
            stack.pop()
            continue
        kind = type(item)
        if kind is list or kind is tuple:
            if depth >= max_depth:
                raise MalformedDataError(f"outputs are nested deeper than {max_depth} levels")
            lists_left -= 1
            if lists_left < 0:
                raise MalformedDataError(f"outputs hold more than {max_lists} lists")
            stack.append((iter(item), depth + 1))
            continue
        if len(leaves) >= max_leaves:
            raise MalformedDataError(f"more than {max_leaves} outputs")
        if kind is bool or kind is float:
            leaves.append(torch.tensor(item))
        elif kind is int:
            if not _INT64[0] <= item <= _INT64[1]:
                raise MalformedDataError("an integer output does not fit in 64 bits")
            leaves.append(torch.tensor(item))
        elif item is None or isinstance(item, torch.Tensor):
            leaves.append(item)
        else:
            raise MalformedDataError(f"outputs contain a {kind.__name__}, expected a tensor, a number or a list")
    return leaves


_END = object()
_UNBOUNDED = 1 << 62


def trusted_leaves(value: Any) -> list[Any]:
    """Leaves of the reference's data (outputs, inputs): trusted, so not held to the candidate's limits."""
    return flatten(value, max_leaves=_UNBOUNDED, max_depth=_UNBOUNDED)


def candidate_leaves(value: Any, reference_leaves: list[Any]) -> list[Any]:
    """`flatten` of a candidate's data, allowed as many leaves as the reference's (trusted_leaves) where those
    exceed MAX_LEAVES: a right answer to such a reference must not read as malformed."""
    return flatten(value, max_leaves=max(MAX_LEAVES, len(reference_leaves)))


def default_tolerance(dtype: torch.dtype) -> float:
    if dtype.is_complex:
        dtype = dtype.to_real()
    if dtype in TOLERANCES:
        return TOLERANCES[dtype]
    return LOW_PRECISION_TOLERANCE if dtype.is_floating_point else 0.0


def _nbytes(value: Any) -> int:
    """Raw bytes of a (trusted) structure's tensors, plus a per-leaf allowance for headers."""
    total = 0
    for leaf in trusted_leaves(value):
        total += LEAF_OVERHEAD_BYTES
        if isinstance(leaf, torch.Tensor):
            total += leaf.numel() * leaf.element_size()
    return total


def output_size_limit(expected: Any, inputs: list[Any]) -> int:
    """Largest output file one trial may write: outputs and inputs_after as big as the reference's, twice over
    (pickle and zip framing, alignment), plus OUTPUT_SLACK_BYTES."""
    return 2 * (_nbytes(expected) + _nbytes(inputs)) + OUTPUT_SLACK_BYTES


def _check_deadline(deadline: float | None) -> None:
    if deadline is not None and time.monotonic() > deadline:
        raise ComparisonTimeoutError(TIME_LIMIT_MESSAGE)


def tensor_problem(what: str, value: torch.Tensor, device: str = "cpu") -> str:
    """Why a candidate tensor is not one our runner writes (plain, dense, on `device`: the CPU but for a copy the
    reference's timer made of a device handover, non-overlapping), or ""."""
    if type(value) is not torch.Tensor:
        return f"{what} is a {type(value).__name__}, expected a plain tensor"
    if value.layout != torch.strided or value.is_nested:
        return f"{what} has layout {value.layout}, expected a dense (strided) tensor"
    want = torch.device(device)
    if value.device.type != want.type or want.index not in (None, value.device.index):
        return f"{what} is on device {value.device}, expected {device}"
    if value.is_quantized:
        return f"{what} is quantized"
    if value.numel() * value.element_size() > value.untyped_storage().nbytes():
        return f"{what} has overlapping memory (expanded strides), expected a dense tensor"
    return ""


def _chunks(tensor: torch.Tensor) -> Iterator[torch.Tensor]:
    flat = tensor.reshape(-1)
    for start in range(0, flat.numel(), CHUNK_ELEMENTS):
        yield flat[start : start + CHUNK_ELEMENTS]


def _as_real(tensor: torch.Tensor) -> torch.Tensor:
    """Complex tensors as (..., 2) real views, so that real and imaginary parts are both compared."""
    tensor = tensor.resolve_conj().resolve_neg()
    return torch.view_as_real(tensor) if tensor.is_complex() else tensor


def _compare_tensor(
    index: int,
    expected: Any,
    actual: Any,
    atol: float | None,
    rtol: float | None,
    errors: list[tuple[float, float]],
    deadline: float | None = None,
    candidate_device: str = "cpu",
) -> str:
    """Reason output `index` is wrong, or empty; appends its (max abs, max rel) error to `errors`."""
    if expected is None:
        return "" if actual is None else f"output {index} is a {type(actual).__name__}, expected None"
    if not isinstance(actual, torch.Tensor):
        return f"output {index} is a {type(actual).__name__}, expected a tensor"
    problem = tensor_problem(f"output {index}", actual, candidate_device)
    if problem:
        return problem
    if actual.shape != expected.shape:
        return f"output {index} has shape {tuple(actual.shape)}, expected {tuple(expected.shape)}"
    if actual.dtype != expected.dtype:
        return f"output {index} has dtype {actual.dtype}, expected {expected.dtype}"
    if not expected.dtype.is_floating_point and not expected.is_complex():
        return (
            ""
            if torch.equal(actual.to(expected.device), expected)
            else f"output {index} differs (exact match required for {expected.dtype})"
        )
    tol = default_tolerance(expected.dtype)
    atol, rtol = atol if atol is not None else tol, rtol if rtol is not None else tol
    max_abs = max_rel = -math.inf
    close = True
    for want_chunk, host_chunk in zip(_chunks(_as_real(expected)), _chunks(_as_real(actual)), strict=True):
        _check_deadline(deadline)
        got_chunk = host_chunk.to(want_chunk.device)  # the candidate's (on the host) goes where the reference's is
        if torch.equal(want_chunk, got_chunk):  # the same bits, no NaN (NaN equals nothing): nothing to measure
            max_abs, max_rel = max(max_abs, 0.0), max(max_rel, 0.0)
            continue
        want, got = want_chunk.double(), got_chunk.double()
        want_finite = torch.isfinite(want)
        if bool((want_finite & ~torch.isfinite(got)).any()):
            return f"output {index} has NaN/Inf where the reference is finite"
        # torch.isclose(got, want, equal_nan=True) in place and without boolean indexing (each a copy), sharing
        # |got - want| with the error measures: where the reference is finite, so is the output (checked above).
        not_finite = ~want_finite
        diff = (got - want).abs_().masked_fill_(not_finite, 0.0)
        scale = want.abs().masked_fill_(not_finite, 0.0)
        if bool(want_finite.any()):
            max_abs = max(max_abs, float(diff.max()))
            max_rel = max(max_rel, float((diff / (scale + atol)).max()))
        close = close and bool((diff <= scale.mul_(rtol).add_(atol)).all())
        if close and bool(not_finite.any()):
            want_rest, got_rest = want[not_finite], got[not_finite]
            close = bool(((got_rest == want_rest) | (got_rest.isnan() & want_rest.isnan())).all())
        del diff, scale, want_finite, not_finite
    if max_abs > -math.inf:
        errors.append((max_abs, max_rel))
    if not close:
        return f"output {index} differs beyond atol={atol:g} rtol={rtol:g}"
    return ""


def _same(before: Any, after: Any, deadline: float | None = None) -> bool:
    """Whether an input leaf is unchanged; NaNs equal NaNs in the same places."""
    if not isinstance(before, torch.Tensor):
        return type(before) is type(after) and before == after
    if not isinstance(after, torch.Tensor) or before.shape != after.shape or before.dtype != after.dtype:
        return False
    if torch.equal(before, after):
        return True
    if not (before.dtype.is_floating_point or before.is_complex()):
        return False
    for b, a in zip(_chunks(_as_real(before)), _chunks(_as_real(after)), strict=True):
        _check_deadline(deadline)
        if not bool(((b == a) | (torch.isnan(b) & torch.isnan(a))).all()):
            return False
    return True


def compare_trial(
    expected: Any,
    inputs: list[Any],
    produced: Any,
    atol: float | None,
    rtol: float | None,
    errors: list[tuple[float, float]],
    *,
    deadline: float | None = None,
    candidate_device: str = "cpu",
) -> tuple[str, bool]:
    """(reason the outputs are wrong or "", whether the candidate changed its inputs).

    `produced` is what the runner saved: {"outputs": ..., "inputs_after": [...]}. Anything else, or outputs the
    runner never writes, is a reason. Raises ComparisonTimeoutError once `deadline` (time.monotonic()) passes.
    `candidate_device`: where the candidate's output tensors must be (the CPU, but for the reference's timer's copy
    of an output handed over in device memory).
    """
    if type(produced) is not dict or set(produced) != {"outputs", "inputs_after"}:
        return "output file is malformed", False
    # The reference's data is trusted (and may exceed the limits); the candidate's may have as many leaves.
    want, before = trusted_leaves(expected), trusted_leaves(inputs)
    if type(produced["inputs_after"]) is not list:
        return "output file is malformed: inputs_after is not a list", False
    try:
        got = candidate_leaves(produced["outputs"], want)
        after = candidate_leaves(produced["inputs_after"], before)
    except MalformedDataError as exc:
        return f"output file is malformed: {exc}", False
    for index, leaf in enumerate(after):
        problem = tensor_problem(f"input {index} after the call", leaf) if isinstance(leaf, torch.Tensor) else ""
        if problem:
            return problem, False
    mutated = len(produced["inputs_after"]) != len(inputs) or len(after) != len(before)
    for b, a in zip(before, after, strict=False):
        if mutated:
            break
        _check_deadline(deadline)
        mutated = not _same(b, a, deadline)
    if len(want) != len(got):
        return f"returned {len(got)} outputs, expected {len(want)}", mutated
    for index, (w, g) in enumerate(zip(want, got, strict=True)):
        _check_deadline(deadline)
        reason = _compare_tensor(index, w, g, atol, rtol, errors, deadline, candidate_device)
        if reason:
            return reason, mutated
    return "", mutated


def compare_outputs(
    out_dir: Path,
    expected: list[Any],
    inputs: list[list[Any]],
    atol: float | None,
    rtol: float | None,
    max_bytes: int,
    *,
    deadline: float | None = None,
    owner_uid: int | None = None,
    trusted_root: Path | None = None,
) -> Comparison:
    """Compare every trial's output file `out_dir/<trial>.pt` with the reference; stops at the first wrong trial.

    `trusted_root` (default `out_dir.parent`, e.g. the worker's home) is the deepest directory the worker cannot
    replace; from there down, `out_dir` and each file are opened without following symlinks, and a file must be a
    regular file with one link, owned by `owner_uid` when given. A file is read only if it is at most `max_bytes`
    and at most `output_size_limit()` of its trial. When `deadline` (a time.monotonic() value) passes between
    trials, leaves or chunks, the result is incorrect with `timed_out` set. Never raises for the candidate's data.
    """
    root = trusted_root if trusted_root is not None else out_dir.parent
    relative = out_dir.relative_to(root)
    all_errors: list[tuple[float, float]] = []
    mutated = False
    for trial, (want, trial_inputs) in enumerate(zip(expected, inputs, strict=True)):
        if deadline is not None and time.monotonic() > deadline:
            return _timed_out(all_errors, mutated)
        limit = min(max_bytes, output_size_limit(want, trial_inputs))
        try:
            data = read_file_beneath(root, relative / f"{trial}.pt", limit, owner_uid)
        except FileTooLargeError as exc:
            return Comparison(False, f"trial {trial}: output file of {exc.size} bytes, expected at most {exc.limit}")
        except Exception as exc:
            return Comparison(False, f"trial {trial}: unreadable output ({type(exc).__name__}: {exc})"[:500])
        try:
            produced = load_data(data)
        except Exception as exc:  # RecursionError, MemoryError, UnpicklingError, ...: the candidate's file
            return Comparison(False, f"trial {trial}: unreadable output ({type(exc).__name__}: {exc})"[:500])
        finally:
            del data
        try:
            reason, trial_mutated = compare_trial(
                want, trial_inputs, produced, atol, rtol, all_errors, deadline=deadline
            )
        except ComparisonTimeoutError:
            return _timed_out(all_errors, mutated)
        except Exception as exc:
            reason, trial_mutated = f"outputs could not be compared ({type(exc).__name__}: {exc})"[:450], False
        del produced
        mutated = mutated or trial_mutated
        if reason:
            return Comparison(False, f"trial {trial}: {reason}", *error_maxima(all_errors), input_mutation=mutated)
    return Comparison(True, "", *error_maxima(all_errors), input_mutation=mutated)


def _timed_out(errors: list[tuple[float, float]], mutated: bool) -> Comparison:
    return Comparison(False, TIME_LIMIT_MESSAGE, *error_maxima(errors), input_mutation=mutated, timed_out=True)


def error_maxima(errors: list[tuple[float, float]]) -> tuple[float | None, float | None]:
    if not errors:
        return None, None
    return max(e[0] for e in errors), max(e[1] for e in errors)
