"""Digests of timed outputs: every call of a timed block is checked against the reference's output on the same
inputs, without moving any output out of the workers.

From the seed the judge sends with the block (so no worker knows them earlier) the worker draws, for each output
tensor, up to SAMPLE_ELEMENTS positions and a weight `w` in [-1, 1] per position, and reduces the values `v` at
those positions over the block's calls:

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

With the sums comes one fingerprint per call: a hash of the raw bits of that call's sampled values. The full check of
a call, chosen after the digest, then holds the candidate to the output it digested: the service recomputes the
fingerprint of the output the worker saves (`call_fingerprint`, same positions: they are drawn on the CPU from the
seed) and an output computed again for the check, exactly where the timed one was not (low precision whose errors
cancel in the sums), no longer matches. Positions and weights are drawn on the CPU from the seed and moved to the
outputs' device, so the service finds the same positions without a GPU.
"""

from __future__ import annotations

import hashlib
import math
from typing import Any

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
# Bytes of a call's fingerprint (BLAKE2b): a second output with the same fingerprint costs about 2**64 tries.
FINGERPRINT_BYTES = 8


def block_digest(outputs: list[Any], seed: int) -> tuple[list[dict[str, Any]], list[str]]:
    """The digest of a block's outputs (one per call, in order): one record per output position with its shape,
    dtype and the three sums over every call (None where not finite), and each call's fingerprint (hex)."""
    calls = [_tensors(output) for output in outputs]
    if not calls:
        return [], []
    layout = [(list(t.shape), str(t.dtype).removeprefix("torch.")) for t in calls[0]]
    for tensors in calls[1:]:
        if [(list(t.shape), str(t.dtype).removeprefix("torch.")) for t in tensors] != layout:
            raise TypeError("the outputs of one block's calls differ in number, shape or dtype")
    hashes = [hashlib.blake2b(digest_size=FINGERPRINT_BYTES) for _ in calls]
    records = []
    for index, (shape, dtype) in enumerate(layout):
        sums = _sums([tensors[index] for tensors in calls], _tensor_seed(seed, index), hashes)
        records.append({"shape": shape, "dtype": dtype, "sums": [v if math.isfinite(v) else None for v in sums]})
    return records, [h.hexdigest() for h in hashes]


def call_fingerprint(output: Any, seed: int) -> str:
    """The fingerprint `block_digest` gives a call whose output is `output` (as saved: on the CPU, tuples as
    lists), under the same seed."""
    digest = hashlib.blake2b(digest_size=FINGERPRINT_BYTES)
    for index, tensor in enumerate(_tensors(output)):
        values = _real(tensor)
        positions, _ = _draw(values, _tensor_seed(seed, index), torch.float32)
        digest.update(_raw_bytes(values.reshape(-1) if positions is None else values[positions]))
    return digest.hexdigest()


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


def _raw_bytes(values: torch.Tensor) -> bytes:
    return values.detach().contiguous().cpu().reshape(-1).view(torch.uint8).numpy().tobytes()


def _sums(tensors: list[torch.Tensor], seed: int, hashes: list[Any]) -> list[float]:
    """D, P1, P2 over the calls' values at the block's positions (float32 values, float64 for exact types,
    complex parts as pairs); each call's raw values go into its hash in `hashes`."""
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
        host = raw.cpu()
        for offset, row in enumerate(host):
            hashes[start + offset].update(_raw_bytes(row))
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


def valid_fingerprints(fingerprints: Any, calls: int) -> bool:
    """Whether a reply's fingerprints have the form of one per call."""
    return (
        isinstance(fingerprints, list)
        and len(fingerprints) == calls
        and all(
            isinstance(f, str) and len(f) == 2 * FINGERPRINT_BYTES and all(c in "0123456789abcdef" for c in f)
            for f in fingerprints
        )
    )


def _tolerances(dtype_name: str, atol: float | None, rtol: float | None) -> tuple[float, float]:
    dtype = getattr(torch, dtype_name, None)
    if not isinstance(dtype, torch.dtype) or not (dtype.is_floating_point or dtype.is_complex):
        return 0.0, 0.0  # exact types: equal sums
    tol = default_tolerance(dtype)
    return (atol if atol is not None else tol), (rtol if rtol is not None else tol)
