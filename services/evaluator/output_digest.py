"""Digests of timed outputs: every call of a timed block is checked against the reference's output on the same
inputs, without moving any output out of the workers.

From a seed the judge sends once the block has ended (so no worker knows them during its calls) the worker draws,
for each output tensor, up to SAMPLE_ELEMENTS positions and a weight `w` in [-1, 1] per position, and reduces the
values `v` at those positions over the block's calls:

    D = sum over calls and positions of w * v          P_k = sum over calls and positions of |v|**k, k = 1, 2

The candidate's D is compared with the reference's on the same inputs. An honest candidate's error `e` is within
tolerance element by element (|e| <= tol = atol + rtol * |r|, the check compare.py makes) and does not depend on
`w`. Summed over the block's `c` calls, the error at one position is at most c times its tolerance, so by
Hoeffding's inequality D differs from the reference's by more than DIGEST_Z * sqrt(c * sum(tol**2)) with
probability under 2 * exp(-DIGEST_Z**2 / 2); the bound is a polynomial in the reference's P_k. Outputs wrong by
much more than the tolerance over many elements (a stale answer, another input's answer, nothing computed) fail
almost surely; a few wrong calls or elements may pass, and are left to the full checks of single calls
(Judge._check). Sampled positions keep the digest's cost per call small and the same for any output layout, so it
adds little, and the same, to both sides' blocks on the judge's clock.

On a GPU (on a CPU the judge reads the output it checks from the worker's memory itself: held_memory) the
positions are unknown during the calls, but code of the candidate's could run in the digest (the worker's code
is within its process's reach) and compute the sampled values then, none in the timed calls. What holds a block to
the outputs its calls produced is therefore a commitment the worker makes before the block's reply, on the judge's
clock, with no secret in it: the sketch of every call's whole output (`block_sketches`: a hash of each tensor's
layout and of the exact sum of its raw bits read as integers). The judge checks a call in full after the block, and
computes the sketch of the output the worker saves for it itself (`output_sketch`): an output filled in or computed
again after the block (by a replaced digest, a thread, the exact version of a call timed in low precision) has other
bits, so another sketch, whatever the worker's code was made to say. Which call is checked is chosen after the
reply, and a right sketch takes the right bits of every element: the work itself. Integer sums are exact, so a GPU
and the service's CPU agree on them to the bit.
"""

from __future__ import annotations

import hashlib
import math
from typing import Any, TypeGuard

import torch

from services.evaluator.compare import default_tolerance

# Positions of each output tensor a block's digest reads (all of them in a smaller tensor).
SAMPLE_ELEMENTS = 4096
# Calls whose sampled values are reduced at once (bounds the digest's memory: 1024 * 4096 float32 = 16 MiB).
CALLS_PER_STEP = 1024
# Standard bounds a digest may be off by: an honest output fails with probability under 2 * exp(-Z**2 / 2) ~ 3e-14.
DIGEST_Z = 8.0
# Rounding of the sums themselves (float32 within a call, float64 across calls) grows like sqrt(P_2): about
# 1e-6 * sqrt(P_2); allowed with a wide margin.
SUM_SLACK = 1e-3
# Exact types are summed in float64: their sums differ only where a value does.
EXACT_SUM_SLACK = 1e-9
# Most output tensors per call (as in compare.py).
MAX_TENSORS = 4096
SUMS = 3  # D, P1, P2
# Bytes of a call's sketch (BLAKE2b of the layout and the bit sums).
SKETCH_BYTES = 8
# Words of output a sketch's reduction reads at once (its int64 copy: 32 MiB).
SKETCH_CHUNK = 4 << 20


def block_digest(outputs: list[Any], seed: int) -> list[dict[str, Any]]:
    """The digest of a block's outputs (one per call, in order): one record per output position with its shape,
    dtype and the three sums over every call (None where not finite)."""
    calls = _calls(outputs)
    records = []
    for index, (shape, dtype) in enumerate(_layout(calls[0]) if calls else []):
        sums = _sums([tensors[index] for tensors in calls], _tensor_seed(seed, index))
        records.append({"shape": shape, "dtype": dtype, "sums": [v if math.isfinite(v) else None for v in sums]})
    return records


def block_sketches(outputs: list[Any]) -> list[str]:
    """The sketch of each call's whole output, as `output_sketch` finds it in the output saved for a check."""
    calls = _calls(outputs)
    if not calls:
        return []
    layout = _layout(calls[0])
    sums: list[list[int]] = [[] for _ in calls]
    for index in range(len(layout)):
        for call, value in enumerate(_bit_sums([tensors[index] for tensors in calls])):
            sums[call].append(value)
    return [_sketch(layout, call_sums) for call_sums in sums]


def output_sketch(output: Any) -> str:
    """The sketch `block_sketches` gives a call whose output is `output` (as saved: on the CPU, tuples as lists)."""
    tensors = _tensors(output)
    return _sketch(_layout(tensors), [_bit_sums([tensor])[0] for tensor in tensors])


def plain(output: Any) -> Any:
    """The output as it is, if it is a plain tensor or a tuple or list of them (what a timed call must return)."""
    _tensors(output)
    return output


def _calls(outputs: list[Any]) -> list[list[torch.Tensor]]:
    calls = [_tensors(output) for output in outputs]
    if any(_layout(tensors) != _layout(calls[0]) for tensors in calls[1:]):
        raise TypeError("the outputs of one block's calls differ in number, shape or dtype")
    return calls


def _layout(tensors: list[torch.Tensor]) -> list[tuple[list[int], str]]:
    return [(list(t.shape), str(t.dtype).removeprefix("torch.")) for t in tensors]


def _sketch(layout: list[tuple[list[int], str]], sums: list[int]) -> str:
    digest = hashlib.blake2b(digest_size=SKETCH_BYTES)
    digest.update(repr((layout, sums)).encode())
    return digest.hexdigest()


def _words(tensor: torch.Tensor) -> torch.Tensor:
    """A tensor's raw bits in its logical order, as integers of 4 bytes (2 or 1 where its size is no multiple)."""
    raw = _real(tensor).contiguous().reshape(-1).view(torch.uint8)
    width = torch.int32 if raw.numel() % 4 == 0 else torch.int16 if raw.numel() % 2 == 0 else torch.uint8
    return raw.view(width)


def _bit_sums(tensors: list[torch.Tensor]) -> list[int]:
    """The exact sum of each tensor's raw bits read as integers (in int64: at most 2**31 * 2**32 for 16 GiB, no
    overflow), one reduction per tensor (stacking small ones was slower: the copy costs more than the launches). A
    sum to int64 makes an int64 copy of what it reads, so a tensor is read in chunks of SKETCH_CHUNK words and its
    memory stays bounded whatever the output's size."""
    sums = []
    for tensor in tensors:
        words = _words(tensor)
        chunks = range(0, max(1, words.numel()), SKETCH_CHUNK)
        sums.append(torch.stack([words[start : start + SKETCH_CHUNK].sum(dtype=torch.int64) for start in chunks]).sum())
    return [int(v) for v in torch.stack(sums).tolist()]


def _tensor_seed(seed: int, index: int) -> int:
    return (seed + index) % (1 << 63)


def _tensors(output: Any) -> list[torch.Tensor]:
    items = list(output) if isinstance(output, list | tuple) else [output]
    if len(items) > MAX_TENSORS:
        raise TypeError(f"more than {MAX_TENSORS} outputs")
    for item in items:
        if type(item) is not torch.Tensor:
            raise TypeError(f"model returned a {type(item).__name__}, not a plain torch.Tensor (or a tuple of them)")
    return items


def _draw(values: torch.Tensor, seed: int, dtype: torch.dtype) -> tuple[tuple[torch.Tensor, ...] | None, torch.Tensor]:
    """The positions a digest reads in `values` (None: all of them) and a weight in [-1, 1] for each, drawn from
    `seed` on the CPU (the same on every device) and moved to `values`' device."""
    # Every device named: a candidate or reference may have set a default device (torch.set_default_device).
    generator = torch.Generator(device="cpu").manual_seed(seed)
    numel = values.numel()
    positions = None
    if numel > SAMPLE_ELEMENTS:
        flat = torch.randint(numel, (SAMPLE_ELEMENTS,), generator=generator, device="cpu")
        positions = tuple(p.to(values.device) for p in torch.unravel_index(flat, values.shape))
    w = torch.rand(min(numel, SAMPLE_ELEMENTS), generator=generator, dtype=dtype, device="cpu").mul_(2).sub_(1)
    return positions, w.to(values.device)


def _sums(tensors: list[torch.Tensor], seed: int) -> list[float]:
    """D, P1, P2 over the calls' values at the block's positions (float32 values, float64 for exact types,
    complex parts as pairs)."""
    first = _real(tensors[0])
    exact = not (first.is_floating_point() and first.dtype != torch.float64)
    dtype = torch.float64 if exact else torch.float32
    positions, w = _draw(first, seed, dtype)
    sums = torch.zeros(SUMS, dtype=torch.float64, device=first.device)
    for start in range(0, len(tensors), CALLS_PER_STEP):
        raw = torch.stack(
            [
                _real(t).reshape(-1) if positions is None else _real(t)[positions]
                for t in tensors[start:][:CALLS_PER_STEP]
            ]
        )
        values = raw.to(dtype)
        sums += torch.stack([(values @ w).sum(), values.abs().sum(), values.pow(2).sum()]).double()
    return [float(v) for v in sums.tolist()]


def _real(tensor: torch.Tensor) -> torch.Tensor:
    values = tensor.detach().resolve_conj().resolve_neg()
    return torch.view_as_real(values) if values.is_complex() else values


def mismatch(reference: Any, candidate: Any, calls: int, atol: float | None, rtol: float | None) -> str:
    """Why the candidate's block digest cannot come from outputs within tolerance of the reference's, or "" (also
    where the reference's own sums are not finite: those outputs are left to the full checks)."""
    if not isinstance(candidate, list) or len(candidate) != len(reference):
        return f"{len(candidate) if isinstance(candidate, list) else 'no'} outputs, expected {len(reference)}"
    for index, (want, got) in enumerate(zip(reference, candidate, strict=True)):
        if got.get("shape") != want["shape"] or got.get("dtype") != want["dtype"]:
            return f"output {index} has another shape or dtype than the reference's"
        if any(value is None for value in want["sums"]):
            continue
        d, p1, p2 = want["sums"]
        got_d = got["sums"][0]
        if not (isinstance(got_d, int | float) and math.isfinite(got_d)):
            return f"output {index} has NaN/Inf where the reference is finite"
        a, r = _tolerances(want["dtype"], atol, rtol)
        numel = math.prod(want["shape"]) * (2 if want["dtype"].startswith("complex") else 1)
        p0 = calls * min(numel, SAMPLE_ELEMENTS)
        # c * sum(tol**2), tol = a + r|v|: the error at one position, summed over c calls, is at most c * tol.
        bound = calls * (a * a * p0 + 2 * a * r * p1 + r * r * p2)
        slack = (EXACT_SUM_SLACK if a == r == 0 else SUM_SLACK) * math.sqrt(p2)
        if abs(got_d - d) > DIGEST_Z * math.sqrt(bound) + slack:
            return f"output {index} differs from the reference's beyond atol={a:g} rtol={r:g}"
    return ""


def valid(records: Any) -> bool:
    """Whether a reply's block digest has the form of one; a malformed one is a tampered reply."""
    return isinstance(records, list) and all(
        isinstance(r, dict)
        and isinstance(r.get("shape"), list)
        and all(isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in r["shape"])
        and isinstance(r.get("dtype"), str)
        and isinstance(r.get("sums"), list)
        and len(r["sums"]) == SUMS
        and all(v is None or (isinstance(v, int | float) and not isinstance(v, bool)) for v in r["sums"])
        for r in records
    )


def valid_sketches(sketches: Any, calls: int) -> TypeGuard[list[str]]:
    """Whether a reply's sketches have the form of one per call."""
    return (
        isinstance(sketches, list)
        and len(sketches) == calls
        and all(
            isinstance(f, str) and len(f) == 2 * SKETCH_BYTES and all(c in "0123456789abcdef" for c in f)
            for f in sketches
        )
    )


def _tolerances(dtype_name: str, atol: float | None, rtol: float | None) -> tuple[float, float]:
    dtype = getattr(torch, dtype_name, None)
    if not isinstance(dtype, torch.dtype) or not (dtype.is_floating_point or dtype.is_complex):
        return 0.0, 0.0  # exact types: equal sums
    tol = default_tolerance(dtype)
    return (atol if atol is not None else tol), (rtol if rtol is not None else tol)
