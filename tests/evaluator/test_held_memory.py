"""The judge's reads of a process's memory: the hash of tensors read where they lie, against the hash of a copy."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from services.evaluator import held_memory

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="needs root")


@pytest.mark.parametrize(
    "dtype", [torch.float32, torch.bfloat16, torch.float64, torch.int64, torch.bool, torch.complex64]
)
def test_the_bytes_in_memory_hash_as_the_saved_output_does(dtype: torch.dtype) -> None:
    """What the judge reads where the worker's output lies is what the saved copy hashes to (this process reads
    its own memory here); a tuple of outputs hashes tensor by tensor, and one bit changed changes the hash."""
    outputs = [torch.randn(37, 5).to(dtype), torch.arange(7)]
    regions = [[t.data_ptr(), t.numel() * t.element_size()] for t in outputs]
    read = held_memory.read_hash(os.getpid(), regions, 1 << 20, True)
    assert read == held_memory.saved_hash([t.clone() for t in outputs])
    changed = outputs[0].clone().reshape(-1).view(torch.uint8)
    changed[0] ^= 1
    assert read != held_memory.saved_hash([changed.view(dtype).reshape(37, 5), outputs[1]])
    assert read != held_memory.saved_hash(outputs[:1])


@pytest.mark.parametrize(
    "make",
    [
        lambda: torch.randn(2, 3, 4, 5).to(memory_format=torch.channels_last),
        lambda: torch.randn(6, 4).t(),
        lambda: torch.randn(8, 8)[2:4],
    ],
    ids=["channels_last", "transposed", "offset_slice"],
)
def test_a_dense_output_is_read_in_place_and_its_saved_copy_hashes_the_same(make) -> None:  # noqa: ANN001
    """A dense output in any order of its dimensions is read where it lies, without a copy on the worker's side (a
    copy would cost the candidate alone time on the clock); the copy a save makes keeps its strides."""
    tensor = make()
    assert held_memory.dense(tensor)
    read = held_memory.read_hash(os.getpid(), [[tensor.data_ptr(), tensor.numel() * 4]], 1 << 20, True)
    assert read == held_memory.saved_hash(tensor.to("cpu", copy=True))
    assert not held_memory.dense(torch.randn(4, 6)[:, ::2]) and not held_memory.dense(torch.randn(3).expand(4, 3))


def test_an_address_with_no_output_or_a_size_beyond_the_bound_is_the_candidates_doing() -> None:
    with pytest.raises(held_memory.UnreadableMemory):
        held_memory.read_hash(os.getpid(), [[8, 64]], 1 << 20, True)  # the first page is never mapped
    tensor = torch.ones(1024)
    with pytest.raises(held_memory.UnreadableMemory):
        held_memory.read_hash(os.getpid(), [[tensor.data_ptr(), 4096]], 4095, True)


@pytest.mark.parametrize(
    "regions", [None, [[[1, 2]]] * 2, [[[1]]], [[[1, -2]]], [[["1", 2]]], [[[True, 2]]], [[1, 2]], [[[1 << 63, 4096]]]]
)
def test_malformed_regions_are_not_valid(regions: object) -> None:
    assert not held_memory.valid_regions(regions, 1)
    assert held_memory.valid_regions([[[1, 2], [3, 0]]], 1)


def test_the_worker_outside_strict_isolation_is_the_process_the_service_started() -> None:
    assert held_memory.worker_pid(os.getpid(), strict=False) == os.getpid()


# A child under this process's uid or (as root) nobody's, dumpable or not as asked, then waits. A uid change leaves
# a process undumpable unless it asks to be dumpable again.
_CHILD = """
import ctypes, os, sys, time
if sys.argv[2] == "other uid":
    os.setresgid(65534, 65534, 65534)
    os.setresuid(65534, 65534, 65534)
ctypes.CDLL(None).prctl(4, int(sys.argv[1]), 0, 0, 0)  # PR_SET_DUMPABLE
print("ready", flush=True)
time.sleep(30)
"""


# As root every process's private /proc files are root's whatever it asked: an unprivileged service's own case is
# checked end to end against the process-isolation server (test_judge.py).
@pytest.mark.parametrize(
    "uid",
    [
        pytest.param("own uid", marks=pytest.mark.skipif(os.geteuid() == 0, reason="needs an unprivileged user")),
        pytest.param("other uid", marks=needs_root),
    ],
)
@pytest.mark.parametrize("dumpable", [True, False])
def test_a_job_that_made_itself_undumpable_is_seen(dumpable: bool, uid: str) -> None:
    """Under the service's own uid (process isolation) only; a job under another uid (strict isolation) is
    undumpable anyway, and its memory is the service's to read with CAP_SYS_PTRACE."""
    child = subprocess.Popen([sys.executable, "-c", _CHILD, str(int(dumpable)), uid], stdout=subprocess.PIPE)
    try:
        assert child.stdout is not None and child.stdout.readline() == b"ready\n"
        assert held_memory.undumpable(child.pid) is (uid == "own uid" and not dumpable)
    finally:
        child.kill()
        child.wait()


@pytest.mark.parametrize("readable", [True, False])
def test_a_refused_read_is_the_jobs_doing_where_the_service_could_read_at_start(
    monkeypatch: pytest.MonkeyPatch, readable: bool
) -> None:
    """A red-team job in process isolation had an escaped helper toggle the worker's dumpability, so the judge's open
    was refused while `undumpable` saw it dumpable a moment later (evaluator_error, no penalty, 1 try in 4). A
    service that read a worker's memory at start-up takes any later refusal as the job's doing."""
    refused = PermissionError(13, "Permission denied")

    def refuse(path: str, *args: object, **kwargs: object) -> None:
        raise refused

    monkeypatch.setattr(held_memory, "open", refuse, raising=False)
    monkeypatch.setattr(held_memory, "undumpable", lambda pid: False)
    if readable:
        with pytest.raises(held_memory.UnreadableMemory, match="unreadable to the judge"):
            held_memory.read_hash(os.getpid(), [[4096, 8]], 1 << 20, readable)
    else:
        with pytest.raises(PermissionError) as raised:
            held_memory.read_hash(os.getpid(), [[4096, 8]], 1 << 20, readable)
        assert not isinstance(raised.value, held_memory.UnreadableMemory)


MAPS_PAGES = """
import ctypes, mmap, os, sys
libc = ctypes.CDLL(None, use_errno=True)
libc.mmap.restype = libc.mremap.restype = ctypes.c_void_p
libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
libc.mremap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_size_t, ctypes.c_int]
rw = mmap.PROT_READ | mmap.PROT_WRITE
kind = sys.argv[1]
if kind == "anonymous, remapped":  # a second address for shared anonymous pages: mremap with an old size of 0
    first = libc.mmap(None, 8192, rw, mmap.MAP_SHARED | mmap.MAP_ANONYMOUS, -1, 0)
    assert libc.mremap(first, 0, 4096, 1) not in (None, ctypes.c_void_p(-1).value)  # MREMAP_MAYMOVE
else:
    fd = os.memfd_create("pages")
    os.ftruncate(fd, 8192)
    flags = mmap.MAP_PRIVATE if kind.startswith("private") else mmap.MAP_SHARED
    for offset in (0, 4096) if kind.endswith("apart") else (0, 0) if kind.endswith("twice") else (0,):
        assert libc.mmap(None, 4096, rw, flags, fd, offset) != ctypes.c_void_p(-1).value
print("mapped", flush=True)
sys.stdin.read()
"""


@pytest.mark.parametrize(
    ("kind", "aliased"),
    [
        ("shared once", False),  # as torch.compile's worker maps a POSIX semaphore
        ("shared, two pages apart", False),
        ("private twice", False),  # copy-on-write: a write gets a page of its own
        ("shared twice", True),
        ("anonymous, remapped", True),
    ],
)
def test_shared_pages_mapped_at_two_addresses_are_found(kind: str, aliased: bool) -> None:
    """A torch process that computed on the CPU has no aliased pages; a memfd's page mapped shared at two addresses
    (as a red-team candidate mapped one 64 KiB memfd over its refills' buffers again and again), or shared anonymous
    memory given a second address by mremap, is found; one mapping of shared pages, or two of different pages, or
    private mappings of the same page, are not."""
    assert held_memory.aliased_pages(os.getpid()) == []
    child = subprocess.Popen(
        [sys.executable, "-c", MAPS_PAGES, kind], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert child.stdout is not None and child.stdout.readline() == "mapped\n"
        found = held_memory.aliased_pages(child.pid)
        assert bool(found) == aliased, found
        assert len(found) <= 1, found
    finally:
        child.kill()
        child.wait()
