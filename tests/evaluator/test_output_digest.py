"""The digest of a timed block: outputs within tolerance of the reference's always pass; stale, garbage, missing
or malformed ones do not."""

from __future__ import annotations

import hashlib
import json
import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from services.evaluator import output_digest
from services.evaluator.sandbox import child_env
from tests.servers import REPO

CALLS = 40


def outputs(seed: int, shape: tuple[int, ...] = (96, 80), dtype: torch.dtype = torch.float32) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return [torch.randn(shape, generator=generator).to(dtype) for _ in range(CALLS)]


def within_tolerance(reference: list[torch.Tensor], atol: float, rtol: float, seed: int) -> list[torch.Tensor]:
    """The worst an honest candidate may do: an error of up to 99.9 % of the tolerance at every element."""
    generator = torch.Generator().manual_seed(seed)
    return [r + (torch.rand(r.shape, generator=generator) * 2 - 1) * (atol + rtol * r.abs()) * 0.999 for r in reference]


def mismatch(reference: list, candidate: list, seed: int = 7, **tolerance: float) -> str:
    return output_digest.mismatch(
        output_digest.block_digest(reference, seed),
        output_digest.block_digest(candidate, seed),
        len(reference),
        tolerance.get("atol"),
        tolerance.get("rtol"),
    )


@pytest.mark.parametrize("shape", [(96, 80), (3, 5), (1 << 14,)], ids=["sampled", "small", "flat"])
def test_outputs_within_tolerance_always_pass(shape: tuple[int, ...]) -> None:
    reference = outputs(0, shape)
    for seed in range(20):
        assert mismatch(reference, within_tolerance(reference, 1e-4, 1e-4, seed), seed) == ""
    assert mismatch(reference, within_tolerance(reference, 1e-2, 1e-2, 1), atol=1e-2, rtol=1e-2) == ""


MEMORY_SETTINGS = ("MALLOC_", "THP_MEM_ALLOC_ENABLE")


def _run_with_workers_memory_settings(
    code: str, tmp_path: Path, settings: bool = True, argv: tuple[str, ...] = ()
) -> Any:
    """`code`'s JSON output, run in a fresh process with a worker's memory settings (sandbox.child_env: glibc's
    malloc, torch's huge pages), or with none of them."""
    env = {name: value for name, value in os.environ.items() if not name.startswith(MEMORY_SETTINGS)}
    if settings:
        env.update(
            {name: value for name, value in child_env(tmp_path, 1, 1).items() if name.startswith(MEMORY_SETTINGS)}
        )
    run = subprocess.run(
        [sys.executable, "-c", code, *argv], env=env, cwd=REPO, capture_output=True, text=True, check=True
    )
    return json.loads(run.stdout)


# A block of `mib` MiB from glibc's malloc: whether it was mapped on its own, and how much free space the heap's top
# keeps once it is freed.
_BLOCK = """
import ctypes, json, sys
class Mallinfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in
                ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")]
libc = ctypes.CDLL(None)
libc.malloc.restype = ctypes.c_void_p
libc.free.argtypes = [ctypes.c_void_p]
libc.mallinfo2.restype = Mallinfo2
if sys.argv[2] == "timing":
    from services.evaluator.sandbox import keep_large_blocks_in_heap
    keep_large_blocks_in_heap()
block = libc.malloc(int(sys.argv[1]) << 20)
mapped = libc.mallinfo2().hblkhd
libc.free(block)
print(json.dumps({"mapped": mapped, "kept": libc.mallinfo2().keepcost}))
"""


@pytest.mark.parametrize("mib", [4, 64, 1536])
def test_a_timing_workers_malloc_keeps_freed_blocks_in_its_heap(tmp_path: Path, mib: int) -> None:
    """By glibc's defaults a 4 MiB block is mapped on its own and unmapped when freed (and later the heap's top is
    given back whenever more than twice the last such block lies free there), so its pages are faulted in afresh
    at its next use; with a worker's settings it comes from the heap and stays there, resident. Once a CPU worker
    times, so does a block beyond the largest mmap threshold glibc takes (32 MiB): a red-team candidate whose only
    change was `mallopt(M_MMAP_MAX, 0)` at import had its 64 MiB outputs reuse resident heap pages where the
    reference's timer mapped and faulted in each afresh, and scored `correct` at 1.5-3.0x for an unchanged `x + y`.
    A block over 1 GiB is kept too (the heap's top was given back beyond 1 GiB, so only a candidate that raised that
    cap kept it). Nothing here touches the block's pages: it costs address space only."""
    block = _run_with_workers_memory_settings(_BLOCK, tmp_path, argv=(str(mib), "timing"))
    assert block["mapped"] == 0
    assert block["kept"] >= mib << 20
    assert _run_with_workers_memory_settings(_BLOCK, tmp_path, settings=False, argv=(str(mib), "-"))["mapped"] > 0


@pytest.mark.parametrize("mib", [4, 64, 1536])
def test_a_worker_maps_its_large_blocks_on_their_own_until_it_times(tmp_path: Path, mib: int) -> None:
    """Outside timing (the reference role's trials, the candidate's correctness trials) a block over 32 MiB is
    mapped on its own and given back when freed: taken from the heap, torch's aligned blocks left room the next ones
    did not reuse, and five trials of 192 MiB inputs took the reference role past a 2 GiB memory limit
    (test_memory.py). Smaller blocks come from the heap as in timing."""
    block = _run_with_workers_memory_settings(_BLOCK, tmp_path, argv=(str(mib), "-"))
    assert (block["mapped"] == 0) if mib < 32 else (block["mapped"] >= mib << 20)


# Page faults of each of 40 digests of one block's outputs in a fresh process (a worker's: one torch thread).
_FAULTS_PER_DIGEST = """
import json, resource, torch
from services.evaluator import output_digest
torch.set_num_threads(1)
outputs = [torch.relu(torch.randn(64, 64)) for _ in range(122)]
faults = []
for seed in range(40):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    output_digest.block_digest(outputs, seed)
    faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
print(json.dumps(faults))
"""


def test_a_workers_digest_stops_faulting_in_fresh_memory(tmp_path: Path) -> None:
    """With a worker's malloc settings a digest's temporaries reuse the pages of the last digest's once the heap
    has grown to hold them (by the eighth digest in every run seen; the heap still grows now and then while it
    settles). By glibc's defaults, where they lay at the top of the heap they were given back to the kernel after
    every digest and faulted in again in the next (944 faults, 5.3 ms a block against 3.0 ms for the same digest in
    a worker whose heap had room for them lower down); which worker that was, its heap's history decided, and an
    honest C++ candidate whose worker it was was rejected for work moved into the digest."""
    faults = _run_with_workers_memory_settings(_FAULTS_PER_DIGEST, tmp_path)
    # Without the settings, 8 runs of 8 here faulted in more of the last 30 (some in every one, about 948 times).
    # A few faults are the interpreter's own (a CI run counted 3 in one of the first digests), not the temporaries'.
    assert sum(1 for count in faults[10:] if count > 100) <= 2, faults


# Whether the memory of a 16 MiB tensor is advised for transparent huge pages ("hg" among its mapping's VmFlags in
# /proc/self/smaps), and how much of it they back.
_HUGE_PAGES_OF_A_TENSOR = """
import json, torch
tensor = torch.empty(16 << 20, dtype=torch.uint8).fill_(1)
address, flags, huge = tensor.data_ptr(), [], 0
with open("/proc/self/smaps") as smaps:
    inside = False
    for line in smaps:
        head = line.split()
        if not head[0].endswith(":"):
            start, end = (int(part, 16) for part in head[0].split("-"))
            inside = start <= address < end
        elif inside and head[0] == "VmFlags:":
            flags = head[1:]
        elif inside and head[0] == "AnonHugePages:":
            huge = int(head[1])
print(json.dumps({"advised": "hg" in flags, "huge_kib": huge}))
"""


@pytest.mark.skipif(
    not Path("/sys/kernel/mm/transparent_hugepage/enabled").exists()
    or "[never]" in Path("/sys/kernel/mm/transparent_hugepage/enabled").read_text(),
    reason="the kernel gives no transparent huge pages",
)
def test_a_workers_large_tensors_are_advised_for_huge_pages(tmp_path: Path) -> None:
    """A worker's large tensors ask for transparent huge pages, so that a memory-bound step runs at one speed in
    every process; with 4 KiB pages its speed depended on the process (a refill of identical code took 10-22 ms a
    block by process), and the judge took an honest candidate's slower process for work moved out of its calls."""
    assert not _run_with_workers_memory_settings(_HUGE_PAGES_OF_A_TENSOR, tmp_path, settings=False)["advised"]
    assert _run_with_workers_memory_settings(_HUGE_PAGES_OF_A_TENSOR, tmp_path)["advised"]


def test_non_contiguous_outputs_have_the_same_digest() -> None:
    reference = outputs(0)
    transposed = [r.t().contiguous().t() for r in reference]
    assert not transposed[0].is_contiguous()
    assert output_digest.block_digest(reference, 3) == output_digest.block_digest(transposed, 3)


@pytest.mark.parametrize(
    "wrong",
    [
        lambda ref: [ref[0], *ref[:-1]],  # each call answered with the previous call's output
        lambda ref: [torch.zeros_like(r) for r in ref],  # nothing computed
        lambda ref: outputs(99),  # another input's answers
        lambda ref: [r + 0.01 for r in ref],  # off by 100x the tolerance everywhere
        lambda ref: [*ref[:-1], torch.randn_like(ref[-1])],  # one call of forty wrong everywhere
    ],
    ids=["stale", "zeros", "other_inputs", "offset", "one_call"],
)
def test_wrong_outputs_fail(wrong) -> None:  # noqa: ANN001
    """A wrong block passes one digest by chance when its sum lands within the bound: about 1 % of the weights for
    answers to other inputs, about a quarter for an offset of 100x the tolerance everywhere. The judge digests every
    block, so a candidate wrong in each passes them all with that probability to the power of the blocks."""
    reference = outputs(0)
    candidate = wrong(reference)
    failed = [mismatch(reference, candidate, seed) for seed in range(10)]
    assert sum("differs from the reference's" in reason for reason in failed) >= 6, failed


def test_wrong_shape_dtype_count_or_nan_fail() -> None:
    reference = outputs(0)
    assert "shape or dtype" in mismatch(reference, [r.double() for r in reference])
    assert "shape or dtype" in mismatch(reference, [r[:, :-1] for r in reference])
    assert "outputs, expected" in mismatch(reference, [(r, r) for r in reference])
    nan = [r.clone() for r in reference]
    nan[3][0, 0] = math.nan
    assert mismatch(reference, nan) != ""


def test_a_reference_that_is_not_finite_is_left_to_the_full_checks() -> None:
    reference = outputs(0)
    reference[0][0, 0] = math.inf
    records = output_digest.block_digest(reference, 1)
    assert None in records[0]["sums"]
    assert mismatch(reference, outputs(5)) == ""


def test_exact_types_must_match_exactly() -> None:
    reference = [torch.arange(12).reshape(3, 4) + call for call in range(CALLS)]
    assert mismatch(reference, [r.clone() for r in reference]) == ""
    off_by_one = [r.clone() for r in reference]
    off_by_one[5][1, 2] += 1
    assert mismatch(reference, off_by_one) != ""


def test_complex_parts_are_both_read() -> None:
    reference = [torch.complex(r, r.flip(0)) for r in outputs(0, (6, 8))]
    assert mismatch(reference, [r.clone() for r in reference]) == ""
    assert mismatch(reference, [torch.complex(r.real, -r.imag) for r in reference]) != ""


def test_input_sets_of_several_kinds_in_one_block_are_digested_kind_by_kind() -> None:
    """A problem's get_inputs may draw sets of more than one shape within a block (KernelBench's draw one): their
    digest reads each kind's sets together, and one element written in place in one set changes it."""
    generator = torch.Generator().manual_seed(3)
    sets = [[torch.randn(n, 16, generator=generator), torch.randint(9, (n,), generator=generator)] for n in (4, 7, 4)]
    digest = output_digest.sets_digest(sets, 5)
    assert [record["shape"] for record in digest] == [[4, 16], [4], [7, 16], [7]]
    assert digest[:2] == output_digest.block_digest([sets[0], sets[2]], output_digest._inputs_seed(5, 0))
    sets[2][0][1, 2] += 1.0
    written = output_digest.sets_digest(sets, 5)
    assert written[0] != digest[0] and written[1:] == digest[1:]
    # Written over with an answer (x + y into x, the hole it closes), a set is beyond any tolerance.
    sets[0][0].add_(torch.randn(4, 16, generator=generator))
    wrong = output_digest.mismatch(digest, output_digest.sets_digest(sets, 5), 2, None, None, inputs=True)
    assert wrong.startswith("input 0 differs from the reference's"), wrong


def test_the_inputs_digest_reads_other_positions_than_the_outputs_under_the_same_seed() -> None:
    """The outputs' digest runs with the candidate's hooks on, so a torch mode sees which positions it reads; an input
    of the output's shape must not be read at the same ones (restoring those would pass the inputs' digest)."""
    x = torch.randn(1 << 20, generator=torch.Generator().manual_seed(4))
    for seed in (5, 1 << 40):
        assert output_digest.sets_digest([[x]], seed)[0]["sums"] != output_digest.block_digest([x], seed)[0]["sums"]


def test_outputs_that_are_not_plain_tensors_are_refused() -> None:
    class Lazy(torch.Tensor):
        pass

    with pytest.raises(TypeError):
        output_digest.block_digest([torch.ones(3).as_subclass(Lazy)], 1)
    with pytest.raises(TypeError):
        output_digest.block_digest([torch.ones(3), torch.ones(4)], 1)


@pytest.mark.parametrize(
    "records",
    [
        None,
        "x",
        [{"shape": [2], "dtype": "float32", "sums": [1.0, 2.0]}],
        [{"shape": [True], "dtype": "f", "sums": [1, 2, 3]}],
    ],
)
def test_malformed_digests_are_not_valid(records) -> None:  # noqa: ANN001
    assert not output_digest.valid(records)
    assert output_digest.valid(output_digest.block_digest(outputs(0), 1))


@pytest.mark.parametrize(
    ("shape", "dtype"),
    [
        ((96, 80), torch.float32),
        ((3, 5), torch.float16),
        ((), torch.float64),
        ((7,), torch.bool),
        ((3,), torch.complex64),
    ],
    ids=["float32", "odd_half", "scalar", "bool_bytes", "complex"],
)
def test_the_service_finds_each_calls_sketch_in_its_saved_output(shape: tuple[int, ...], dtype: torch.dtype) -> None:
    """What the worker sketches at the end of a block and what it saves for a check (a CPU copy, tuples as lists)
    have one sketch, a non-contiguous copy included; one bit changed anywhere in the output changes it."""
    calls = [(r, r * 2) for r in outputs(0, shape, dtype)]
    sketches = output_digest.block_sketches(calls)
    assert len(set(sketches)) == CALLS or dtype == torch.bool
    for output, sketch in zip(calls, sketches, strict=True):
        saved = [output[0].t().contiguous().t() if output[0].dim() == 2 else output[0].clone(), output[1].clone()]
        assert output_digest.output_sketch(saved) == sketch
    first = calls[0][0]
    for position in (0, first.numel() - 1, first.numel() // 2):
        flipped = first.clone().reshape(-1).view(torch.uint8)
        flipped.reshape(-1)[position * first.element_size()] ^= 1
        changed = flipped.view(first.dtype).reshape(first.shape)
        assert output_digest.output_sketch([changed, calls[0][1]]) != sketches[0]
    assert output_digest.output_sketch([calls[0][1], calls[0][0]]) != sketches[0]


def _tree(data: bytes) -> bytes:
    """The tree the sketch hashes, written out: BLAKE2s of each 4 KiB of a level, until at most 32 bytes remain."""
    while len(data) > 32:
        data = b"".join(hashlib.blake2s(data[i : i + 4096]).digest() for i in range(0, len(data), 4096))
    return data


@pytest.mark.parametrize("length", [0, 5, 32, 33, 4096, 4097, 5 << 20])
def test_the_tree_root_is_blake2s_level_by_level(monkeypatch: pytest.MonkeyPatch, length: int) -> None:
    """Whether a level is hashed in threads (above 4 MiB) or not, the root is the written-out tree's."""
    data = torch.randint(256, (length,), dtype=torch.uint8, generator=torch.Generator().manual_seed(length))
    expected = _tree(data.numpy().tobytes())
    assert output_digest._tree_roots([data]) == [expected]
    monkeypatch.setattr(output_digest, "THREADED_BYTES", 0)
    assert output_digest._tree_roots([data]) == [expected]


def test_an_output_computed_again_exactly_does_not_match_a_low_precision_one() -> None:
    """One attack the sketches close: timed calls in bfloat16 whose errors cancel in the digest's sums, the checked
    call computed again in float32."""
    reference = outputs(0, (256, 256))
    low = [r.bfloat16().float() for r in reference]
    sketches = output_digest.block_sketches(low)
    assert all(output_digest.output_sketch(r) != f for r, f in zip(reference, sketches, strict=True))


@pytest.mark.parametrize("sketches", [None, ["00" * 16], ["zz" * 16] * CALLS, ["00" * 17] * CALLS, [1] * CALLS])
def test_malformed_sketches_are_not_valid(sketches) -> None:  # noqa: ANN001
    assert not output_digest.valid_sketches(sketches, CALLS)
    assert output_digest.valid_sketches(output_digest.block_sketches(outputs(0)), CALLS)


def test_a_default_device_set_by_the_candidate_changes_nothing() -> None:
    """Positions and weights are drawn on the CPU whatever default device the process has set."""
    calls = outputs(0)
    expected = output_digest.block_digest(calls, 4)
    torch.set_default_device("meta")
    try:
        assert output_digest.block_digest(calls, 4) == expected
    finally:
        torch.set_default_device(None)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize(
    "dtype", [torch.float32, torch.bfloat16, torch.float16, torch.float64, torch.int64, torch.bool, torch.complex64]
)
def test_a_gpu_sketch_is_the_one_the_service_computes_from_the_saved_copy(dtype: torch.dtype) -> None:
    """The worker hashes outputs on the GPU (chunk_hash.cu), the service the saved CPU copy with hashlib: the same
    sketch, for small outputs, sizes that are no multiple of a word or a chunk, a view that starts off a 16-byte
    boundary, and a 1 GiB output."""
    assert output_digest._chunk_hash_kernel() is not None, output_digest._unavailable
    small = [t.cuda() for t in outputs(0, (33, 7), dtype)]
    assert output_digest.block_sketches(small) == [output_digest.output_sketch(t.cpu()) for t in small]
    odd = [t.cuda() for t in outputs(1, (1031, 5), dtype)]
    assert output_digest.block_sketches(odd) == [output_digest.output_sketch(t.cpu()) for t in odd]
    shifted = [torch.randint(256, (4096 * 3 + 9,), dtype=torch.uint8, device="cuda")[1:] for _ in range(3)]
    assert shifted[0].data_ptr() % 16 != 0
    assert output_digest.block_sketches(shifted) == [output_digest.output_sketch(t.cpu()) for t in shifted]
    if dtype == torch.float32:
        large = torch.randn(1 << 28, device="cuda")
        assert output_digest.block_sketches([large]) == [output_digest.output_sketch(large.cpu())]


def _rewritten_to_sum(output: torch.Tensor, target: int) -> torch.Tensor:
    """`output` with its exact zeros rewritten to floats within 1e-4 of 0 (-0.0 and tiny subnormals, as int32
    words in [0, 2**20) or [-2**31, -2**31 + 2**20)) so that its raw bits sum to `target`."""
    words = output.clone().view(torch.int32).reshape(-1)
    zeros = (output.reshape(-1) == 0).nonzero().reshape(-1)
    words[zeros] = 0
    delta = target - int(words.sum(dtype=torch.int64))
    negatives = max(0, -(delta // (1 << 31)))  # elements set to -0.0-ish, each worth -2**31
    delta += negatives << 31
    share, rest = divmod(delta, zeros.numel() - negatives)
    assert 0 <= share < (1 << 20) - 1, "not enough zeros to spread the difference over"
    values = torch.full((zeros.numel(),), share, dtype=torch.int64)
    values[:negatives] = -(1 << 31)
    values[negatives : negatives + rest] += 1
    words[zeros] = values.to(torch.int32)
    return words.view(torch.float32).reshape(output.shape)


def test_no_output_within_tolerance_of_the_right_one_has_the_sketch_of_an_uncomputed_one() -> None:
    """The red team's forgery of the sketch when it was a sum of the raw bits (a correct output whose zeros are
    rewritten within the tolerance to the sum of a zero tensor's bits) matches that sum, not the hash of the bytes."""
    right = torch.relu(torch.randn(512, 512, generator=torch.Generator().manual_seed(0)))
    committed = torch.zeros_like(right)  # what a call that computed nothing returned, sketched at the block's end
    forged = _rewritten_to_sum(right, int(committed.view(torch.int32).sum(dtype=torch.int64)))
    assert torch.allclose(forged, right, atol=1e-4, rtol=1e-4)
    assert int(forged.view(torch.int32).sum(dtype=torch.int64)) == int(
        committed.view(torch.int32).sum(dtype=torch.int64)
    )
    assert output_digest.output_sketch(forged) != output_digest.output_sketch(committed)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the fall-back where no device hash can be compiled")
def test_a_device_hash_that_cannot_be_compiled_says_why_and_raises_nothing() -> None:
    """A worker whose GPU hash fails to compile or to agree with hashlib starts anyway and hashes on the host."""
    output_digest._chunk_hash_kernel.cache_clear()
    try:
        assert output_digest.prepare("cpu") == ""
        assert output_digest.prepare("cuda") != ""
    finally:
        output_digest._chunk_hash_kernel.cache_clear()
