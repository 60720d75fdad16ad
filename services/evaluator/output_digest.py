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
adds little, and the same, to both sides' blocks on the judge's clock. The same sums over the block's input sets as
its calls left them (`sets_digest`) are held to the reference's with no tolerance: untouched sets are the same draws.

On a GPU (on a CPU the judge reads the output it checks from the worker's memory itself: held_memory) the
positions are unknown during the calls, but code of the candidate's could run in the digest (the worker's code
is within its process's reach) and compute the sampled values then, none in the timed calls. What holds a block to
the outputs its calls produced is therefore a commitment the worker makes before the block's reply, on the judge's
clock, with no secret in it: the sketch of every call's whole output (`block_sketches`: a hash of each tensor's
layout and of the root of a BLAKE2s tree over its raw bytes, hashed on the GPU by chunk_hash.cu). The judge checks
a call in full after the block, and computes the sketch of the output the worker saves for it itself
(`output_sketch`, with hashlib): an output filled in or computed again after the block (by a replaced digest, a
thread, the exact version of a call timed in low precision) has other bytes, so another sketch, whatever the
worker's code was made to say. Which call is checked is chosen after the reply, and a right sketch takes the right
bytes of every element: the work itself. A hash binds every bit: the freedom the tolerance leaves an output does
not help to match a sketch (it did when the sketch was a sum of the bits: a few zeros rewritten within the
tolerance brought a correct output to the sum of an uncomputed one); that takes a BLAKE2s second preimage.
"""

from __future__ import annotations

import functools
import hashlib
import math
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
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
# Bytes of a call's sketch (BLAKE2b of the layout and each tensor's tree root).
SKETCH_BYTES = 16
# A level of the tree is the BLAKE2s digest of each TREE_CHUNK bytes of the one below (the raw bytes at the bottom),
# up to a root of at most DIGEST_BYTES; KA_CHUNK in chunk_hash.cu. hashlib releases the GIL from 2 KiB on, so the
# service hashes a large saved output in threads.
TREE_CHUNK = 4096
DIGEST_BYTES = 32
# Threads per block of the device hash, and the most calls one launch takes (gridDim.y).
HASH_THREADS = 128
MAX_CALLS_PER_LAUNCH = 65535
# Bytes of a level above which the service hashes it in threads.
THREADED_BYTES = 4 << 20

_unavailable: list[str] = []  # why the device hash could not be used, where it could not


def block_digest(outputs: list[Any], seed: int) -> list[dict[str, Any]]:
    """The digest of a block's outputs (one per call, in order): one record per output position with its shape,
    dtype and the three sums over every call (None where not finite)."""
    calls = _calls(outputs)
    records = []
    for index, (shape, dtype) in enumerate(_layout(calls[0]) if calls else []):
        sums = _sums([tensors[index] for tensors in calls], _tensor_seed(seed, index))
        records.append({"shape": shape, "dtype": dtype, "sums": [v if math.isfinite(v) else None for v in sums]})
    return records


def sets_digest(sets: list[list[torch.Tensor]], seed: int) -> list[dict[str, Any]]:
    """`block_digest` of a block's input sets (each a list of plain tensors), which unlike its outputs may differ in
    layout from call to call (a problem's `get_inputs` may draw sets of more than one kind): the sets of each layout
    digested together, in the order each layout first appears, each under a seed of its own (_inputs_seed)."""
    groups: dict[str, list[list[torch.Tensor]]] = {}
    for tensors in sets:
        groups.setdefault(repr(_layout(tensors)), []).append(tensors)
    return [
        record
        for number, group in enumerate(groups.values())
        for record in block_digest(group, _inputs_seed(seed, number))
    ]


def _inputs_seed(seed: int, group: int) -> int:
    """The seed of a group of input sets' digest, drawn apart from the outputs' under the same `seed`: where an input
    shares its shape with an output, the positions one digest reads would otherwise name the other's (for an add, an
    input's value is the output's less the other input's). It narrows what seeing one digest tells, no more: both
    now run with the candidate's hooks off (runner), and a red-team mode that saw the outputs' digest while it ran
    with them on read the seed off its generator and derived these positions all the same."""
    derived = hashlib.blake2b(f"inputs {seed} {group}".encode(), digest_size=8).digest()
    return int.from_bytes(derived, "little") % (1 << 62)


def block_sketches(outputs: list[Any]) -> list[str]:
    """The sketch of each call's whole output, as `output_sketch` finds it in the output saved for a check."""
    calls = _calls(outputs)
    if not calls:
        return []
    layout = _layout(calls[0])
    roots: list[list[bytes]] = [[] for _ in calls]
    for index in range(len(layout)):
        for call, root in enumerate(_tree_roots([tensors[index] for tensors in calls])):
            roots[call].append(root)
    return [_sketch(layout, call_roots) for call_roots in roots]


def output_sketch(output: Any) -> str:
    """The sketch `block_sketches` gives a call whose output is `output` (as saved: on the CPU, tuples as lists)."""
    tensors = _tensors(output)
    return _sketch(_layout(tensors), [_tree_roots([tensor])[0] for tensor in tensors])


def output_sketch_on(output: Any, device: str) -> str:
    """`output_sketch` of an output saved on the host, hashed on `device` (the tree is the same on every device), one
    tensor on the device at a time: the reference's timer that hashes it holds its own output of the call too."""
    tensors = _tensors(output)
    return _sketch(_layout(tensors), [_tree_roots([tensor.to(device)])[0] for tensor in tensors])


def prepare(device: str) -> str:
    """Compile (and test) the device hash where sketches are made on a GPU, so that no timed block pays for it;
    why it is unavailable (outputs are then hashed on the host), or ""."""
    if device.startswith("cuda") and _chunk_hash_kernel() is None:
        return _unavailable[-1]
    return ""


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


def _sketch(layout: list[tuple[list[int], str]], roots: list[bytes]) -> str:
    digest = hashlib.blake2b(digest_size=SKETCH_BYTES)
    digest.update(repr((layout, roots)).encode())
    return digest.hexdigest()


def raw_bytes(tensor: torch.Tensor) -> torch.Tensor:
    """A tensor's raw bytes in its logical order (complex values as real pairs, lazy negation and conjugation
    resolved): what a sketch hashes, and what a check's device handover carries (device_handover)."""
    return _real(tensor).contiguous().reshape(-1).view(torch.uint8)


def _tree_roots(tensors: list[torch.Tensor]) -> list[bytes]:
    """The root of the BLAKE2s tree over each tensor's raw bytes (tensors of one shape and dtype)."""
    raws = [raw_bytes(tensor) for tensor in tensors]
    if raws[0].is_cuda:
        kernel = _chunk_hash_kernel()
        if kernel is not None:
            return _device_roots(kernel, raws)
    return [_host_root(raw.cpu().numpy().data) for raw in raws]


def _host_root(level: memoryview | bytes) -> bytes:
    while len(level) > DIGEST_BYTES:
        starts = range(0, len(level), TREE_CHUNK)
        if len(level) > THREADED_BYTES:
            with ThreadPoolExecutor(min(8, os.cpu_count() or 1)) as pool:
                parts = list(pool.map(functools.partial(_chunk_digests, level), _slices(starts, 64)))
            level = b"".join(parts)
        else:
            level = _chunk_digests(level, starts)
    return bytes(level)


def _chunk_digests(level: memoryview | bytes, starts: range) -> bytes:
    return b"".join(hashlib.blake2s(level[start : start + TREE_CHUNK]).digest() for start in starts)


def _slices(starts: range, parts: int) -> list[range]:
    step = -(-len(starts) // parts)
    return [starts[i : i + step] for i in range(0, len(starts), step)]


@functools.cache
def _chunk_hash_kernel() -> Any | None:
    """chunk_hash.cu compiled for the current GPU by NVRTC (torch's private `torch.cuda._compile_kernel`: no nvcc
    needed), once it has hashed a test buffer as hashlib does. None where it cannot be compiled or disagrees: GPU
    outputs are then copied to the host and hashed there, the same sketch at a higher cost to both sides' blocks."""
    try:
        source = Path(__file__).with_name("chunk_hash.cu").read_text()
        kernel = torch.cuda._compile_kernel(source, "ka_chunk_hashes")
        sample = torch.randint(256, (3 * TREE_CHUNK + 41,), dtype=torch.uint8, generator=torch.Generator()).cuda()
        views = [sample[:-1], sample[1:]]  # one length, as a block's calls have; the second off a 16-byte boundary
        expected = [_host_root(view.cpu().numpy().data) for view in views]
        if _device_roots(kernel, views) != expected:
            raise RuntimeError("its digests differ from hashlib's")
    except Exception as error:  # any failure of a private API or of the kernel: the host computes the same hash
        _unavailable.append(f"{type(error).__name__}: {error}")
        return None
    return kernel


def _device_roots(kernel: Any, raws: list[torch.Tensor]) -> list[bytes]:
    """`_host_root` of each buffer, computed on its GPU: one launch per level for every call at once."""
    roots = []
    for start in range(0, len(raws), MAX_CALLS_PER_LAUNCH):
        group = [raw if raw.data_ptr() % 16 == 0 else raw.clone() for raw in raws[start : start + MAX_CALLS_PER_LAUNCH]]
        device, length = group[0].device, group[0].numel()
        if length <= DIGEST_BYTES:
            level = torch.stack(group) if length else torch.empty((len(group), 0), dtype=torch.uint8)
        else:
            # `below` holds what `sources` point at until the launch that reads it has been queued (a level freed
            # before would be read after the allocator took it back).
            below: Any = group
            sources = torch.tensor([raw.data_ptr() for raw in group], dtype=torch.int64, device=device)
            while length > DIGEST_BYTES:
                chunks = -(-length // TREE_CHUNK)
                level = torch.empty((len(group), chunks * DIGEST_BYTES), dtype=torch.uint8, device=device)
                kernel(
                    grid=(-(-chunks // HASH_THREADS), len(group), 1),
                    block=(HASH_THREADS, 1, 1),
                    args=[sources, level, chunks, length - (chunks - 1) * TREE_CHUNK],
                )
                below, length = level, chunks * DIGEST_BYTES
                sources = torch.arange(len(group), dtype=torch.int64, device=device) * length + below.data_ptr()
        roots += [row.tobytes() for row in level.cpu().numpy()]
    return roots


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


def mismatch(
    reference: Any, candidate: Any, calls: int, atol: float | None, rtol: float | None, inputs: bool = False
) -> str:
    """Why the candidate's block digest cannot come from outputs within tolerance of the reference's, or "" (also
    where the reference's own sums are not finite: those outputs are left to the full checks).

    `inputs`: the digests are of the block's input sets after its calls (sets_digest). Sets the calls left as drawn
    are the same draws on both sides, so no tolerance is allowed, only the rounding of the sums (floating sums may
    be reduced in another order): under the outputs' tolerance, whose bound grows with the calls, a candidate that
    wrote its answers into its inputs passed whole blocks of fast calls."""
    what = "input" if inputs else "output"
    if not isinstance(candidate, list) or len(candidate) != len(reference):
        return f"{len(candidate) if isinstance(candidate, list) else 'no'} {what}s, expected {len(reference)}"
    for index, (want, got) in enumerate(zip(reference, candidate, strict=True)):
        if got.get("shape") != want["shape"] or got.get("dtype") != want["dtype"]:
            return f"{what} {index} has another shape or dtype than the reference's"
        if any(value is None for value in want["sums"]):
            continue
        d, p1, p2 = want["sums"]
        got_d = got["sums"][0]
        if not (isinstance(got_d, int | float) and math.isfinite(got_d)):
            return f"{what} {index} has NaN/Inf where the reference is finite"
        exact_type = _tolerances(want["dtype"], None, None) == (0.0, 0.0)
        a, r = (0.0, 0.0) if inputs else _tolerances(want["dtype"], atol, rtol)
        numel = math.prod(want["shape"]) * (2 if want["dtype"].startswith("complex") else 1)
        p0 = calls * min(numel, SAMPLE_ELEMENTS)
        # c * sum(tol**2), tol = a + r|v|: the error at one position, summed over c calls, is at most c * tol.
        bound = calls * (a * a * p0 + 2 * a * r * p1 + r * r * p2)
        exact_sums = a == r == 0 and (exact_type or not inputs)
        slack = (EXACT_SUM_SLACK if exact_sums else SUM_SLACK) * math.sqrt(p2)
        if abs(got_d - d) > DIGEST_Z * math.sqrt(bound) + slack:
            return f"{what} {index} differs from the reference's beyond atol={a:g} rtol={r:g}"
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
