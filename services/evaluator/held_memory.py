"""The judge's own record of a CPU output, read from the worker's memory while its job is stopped.

A block's reply says where each call's output tensors lie in the worker's memory (address and size: `regions`).
For the call it will check, the judge copies those bytes itself through /proc/<pid>/mem before the job runs again,
into the reference timer's `inputs`, where the timer compares them (copy_out): the check is of what the timed call
left in memory when the block ended, byte for byte, and nothing of the candidate runs for it. Nothing the
candidate's process says or computes enters that copy but where it lies and how it is laid out (a false address
only checks the bytes that are there), so unlike the sketch (output_digest), which that process computes and which
a tolerance-sized rewrite can match, it binds every element. The inputs of the same call are hashed (read_hash)
against the timer's hash of its own. CPU only: a GPU output is not in the process's memory (its sketch is the
commitment there, and the candidate saves it).
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from typing import Any

import torch

from services.evaluator.sandbox import tool_env

# Bytes read from the worker's memory at a time.
READ_CHUNK = 16 << 20
# No region reaches past this (a file offset is signed 64-bit: beyond it pread raises OverflowError).
ADDRESS_END = 1 << 63


class UnreadableMemory(OSError):
    """The worker's memory could not be read where its reply said the output was, or at all because the job made
    itself undumpable: the candidate's doing. Any other OSError here (no /proc entry, a kernel that forbids the
    read) is the service's: it then has no hash of its own."""


def valid_regions(regions: Any, calls: int) -> bool:
    """Whether a reply's regions have the form of one list of (address, size) pairs per call."""
    return (
        isinstance(regions, list)
        and len(regions) == calls
        and all(
            isinstance(call, list)
            and all(
                isinstance(pair, list)
                and len(pair) == 2
                and all(isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in pair)
                and pair[0] + pair[1] < ADDRESS_END
                for pair in call
            )
            for call in regions
        )
    )


def worker_pid(root_pid: int, strict: bool) -> int:
    """The pid, as the service sees it, of the process running the worker's code: in strict isolation the child
    of the relay the service started (pid 1 of the job's namespace), else the process the service started. Found
    in the process table (/proc/<pid>/task/<pid>/children is not in every kernel)."""
    if not strict:
        return root_pid
    from services.evaluator.sandbox import process_table

    children = [pid for pid, (parent, _) in process_table().items() if parent == root_pid]
    if len(children) != 1:
        raise ProcessLookupError(f"the job's relay has {len(children)} children")
    return children[0]


def memory_unreadable_reason(uid: int | None) -> str:
    """Why this process cannot read the memory of a job's worker (and so bind a checked CPU output to what its
    timed call left there), or "": tried on a child under `uid` (strict isolation's sandbox uid, which needs
    CAP_SYS_PTRACE) or under this process's own (process isolation, where Yama may forbid it)."""
    code = (
        "import ctypes, os, sys, time\n"
        "uid = int(sys.argv[1])\n"
        "if uid >= 0:\n"
        "    os.setgroups([]); os.setresgid(uid, uid, uid); os.setresuid(uid, uid, uid)\n"
        "probe = ctypes.create_string_buffer(b'kernel-agent-probe')\n"
        "print(ctypes.addressof(probe), flush=True)\n"
        "time.sleep(60)\n"
    )
    child = subprocess.Popen(
        [sys.executable, "-I", "-c", code, str(-1 if uid is None else uid)], stdout=subprocess.PIPE, cwd="/",
        env=tool_env(),
    )  # fmt: skip
    try:
        assert child.stdout is not None
        address = int(child.stdout.readline() or b"-1")
        if address < 0:
            return "the probe process did not start"
        with open(f"/proc/{child.pid}/mem", "rb", buffering=0) as memory:
            seen = os.pread(memory.fileno(), 18, address)
        return "" if seen == b"kernel-agent-probe" else "the probe's memory read back wrong"
    except OSError as error:
        return f"{type(error).__name__}: {error}"
    finally:
        child.kill()
        child.wait()


def read_hash(pid: int, regions: list[list[int]], max_bytes: int, readable: bool) -> str:
    """BLAKE2b of the tensors at `regions` in a stopped process's memory, each preceded by its size. `readable`:
    this service read a worker's memory at start-up (memory_unreadable_reason), so a refusal now is the job's."""
    digest = hashlib.blake2b()
    for size, chunks in _read(pid, regions, max_bytes, readable):
        digest.update(size.to_bytes(8, "little"))
        for chunk in chunks:
            digest.update(chunk)
    return digest.hexdigest()


def copy_out(
    pid: int, regions: list[list[int]], max_bytes: int, readable: bool, write: Callable[[bytes], object]
) -> None:
    """`write` the tensors at `regions` in a stopped process's memory, a chunk at a time, one after another, as they
    lie there (`readable` as read_hash's): the judge's own copy of a checked output, which the job never touches."""
    for _, chunks in _read(pid, regions, max_bytes, readable):
        for chunk in chunks:
            write(chunk)


def _read(pid: int, regions: list[list[int]], max_bytes: int, readable: bool) -> Iterator[tuple[int, Iterator[bytes]]]:
    """Each region's size and its bytes, a chunk at a time, from a stopped process's memory."""
    if sum(size for _, size in regions) > max_bytes:
        raise UnreadableMemory(f"the output is said to be larger than {max_bytes} bytes")
    try:
        memory = open(f"/proc/{pid}/mem", "rb", buffering=0)  # noqa: SIM115 - closed by the with below
    except PermissionError:
        if undumpable(pid):
            raise UnreadableMemory("the job made itself undumpable, so the judge cannot read its output") from None
        if readable:  # a helper that toggles dumpability can make `undumpable` miss it (a red-team race)
            raise UnreadableMemory("the job made its memory unreadable to the judge") from None
        raise
    with memory:
        for address, size in regions:
            yield size, _chunks(memory.fileno(), address, size)


def _chunks(memory: int, address: int, size: int) -> Iterator[bytes]:
    done = 0
    while done < size:
        try:
            chunk = os.pread(memory, min(READ_CHUNK, size - done), address + done)
        except (OSError, OverflowError, ValueError) as error:
            raise UnreadableMemory(f"no output at the address the reply gave: {error}") from error
        if not chunk:
            raise UnreadableMemory("no output at the address the reply gave")
        yield chunk
        done += len(chunk)


def poison(pid: int, regions: list[list[int]], max_bytes: int, readable: bool) -> None:
    """Overwrite the tensors at `regions` in a worker's memory with 0xFF bytes (NaN in every float type), as a caller
    that reuses an output it was handed may. A job whose next outputs are right only because memory it returned
    before still holds what it left there (a pool of returned buffers whose zeros a sparse output keeps) then returns
    wrong ones. Raises UnreadableMemory where a region is not in the process's memory, or where the job barred the
    judge (`readable` as read_hash's)."""
    if sum(size for _, size in regions) > max_bytes:
        raise UnreadableMemory(f"the outputs are said to be larger than {max_bytes} bytes")
    fill = b"\xff" * min(READ_CHUNK, max((size for _, size in regions), default=0))
    try:
        memory = open(f"/proc/{pid}/mem", "wb", buffering=0)  # noqa: SIM115 - closed by the with below
    except PermissionError:
        if undumpable(pid):
            raise UnreadableMemory(
                "the job made itself undumpable, so the judge cannot overwrite its outputs"
            ) from None
        if readable:
            raise UnreadableMemory("the job made its memory unwritable to the judge") from None
        raise
    with memory:
        for address, size in regions:
            done = 0
            while done < size:
                try:
                    written = os.pwrite(memory.fileno(), fill[: min(READ_CHUNK, size - done)], address + done)
                except (OSError, OverflowError, ValueError) as error:
                    raise UnreadableMemory(f"no output at the address the reply gave: {error}") from error
                if not written:
                    raise UnreadableMemory("no output at the address the reply gave")
                done += written


def aliased_pages(pid: int) -> list[str]:
    """The stopped worker's writable shared mappings (/proc/<pid>/maps) that put the same backing pages (a file, a
    memfd, shared anonymous memory: device and inode, with the offset range) at more than one address. Mapped over
    and over onto one small memfd, a red-team candidate's refill buffers (every call once took one set of input
    buffers, refilled before it) wrote the same few cache-resident pages at every refill (the buffers left holding
    garbage; its calls read the drawn sets instead), and the time that saved, which the judge takes as the same on
    both sides, paid for a second thread (`correct` at 1.6-1.9x with no flag in both levels against an add of two
    16 MB vectors). A shared mapping as such is no sign: torch.compile's worker
    maps a POSIX semaphore, and a helper process may hand results over through shared memory (the judge's clock
    holds that). NVIDIA's device files are left out: their offsets are not pages of one object."""
    try:
        with open(f"/proc/{pid}/maps") as maps:
            lines = maps.read().splitlines()
    except PermissionError:
        raise UnreadableMemory("the job made its memory map unreadable to the judge") from None
    # Each backing's mappings by offset: a mapping that starts before the furthest end so far shares its pages.
    # Sorted rather than compared pairwise: a red-team candidate's 31,000 one-page mappings of one memfd took a
    # pairwise scan 10.8 s of the service's CPU per read, in a thread no timeout cancels.
    by_backing: dict[tuple[str, str], list[tuple[int, int, str, str]]] = {}
    for line in lines:
        fields = line.split(maxsplit=5)
        path = fields[5] if len(fields) > 5 else ""
        if fields[1][1] != "w" or fields[1][3] != "s" or path.startswith("/dev/nvidia"):
            continue
        low, high = (int(bound, 16) for bound in fields[0].split("-"))
        first = int(fields[2], 16)
        by_backing.setdefault((fields[3], fields[4]), []).append(
            (first, first + high - low, fields[0], " ".join(fields))
        )
    aliased = []
    for mappings in by_backing.values():
        reach, reached_by = -1, ""
        for first, last, addresses, described in sorted(mappings):
            if first < reach:
                aliased.append(f"{described} (the pages of {reached_by})")
            if last > reach:
                reach, reached_by = last, addresses
    return aliased


def undumpable(pid: int) -> bool:
    """Whether a process under this process's own uid made itself undumpable (PR_SET_DUMPABLE 0): the kernel then
    gives its private /proc files (`mem` among them) to root instead of its effective uid, and only a process with
    CAP_SYS_PTRACE may read its memory. A worker under the service's uid (process isolation) never is unless its job
    asked; a strict worker is (its uid changed), but its service reads it with CAP_SYS_PTRACE."""
    with open(f"/proc/{pid}/status", "rb") as handle:
        euid = next(int(line.split()[2]) for line in handle if line.startswith(b"Uid:"))
    return euid == os.geteuid() and os.stat(f"/proc/{pid}/mem").st_uid != euid


def dense(tensor: torch.Tensor) -> bool:
    """Whether a tensor's elements fill one span of memory without gaps or overlaps, in some order of its dimensions
    (contiguous, channels_last, a transpose...): that span, from its first element, is then all of it."""
    expected = 1
    pairs = sorted((stride, size) for size, stride in zip(tensor.shape, tensor.stride(), strict=True) if size != 1)
    for stride, size in pairs:
        if stride != expected:
            return False
        expected *= size
    return True


def in_memory_order(tensor: torch.Tensor) -> torch.Tensor:
    """A dense tensor's elements in the order memory holds them (what `read_hash` reads)."""
    return torch.as_strided(tensor, (tensor.numel(),), (1,), tensor.storage_offset())


def saved_hash(output: Any) -> str:
    """The hash `read_hash` finds for tensors (or a list of them) where they lie: the reference timer's own hash of
    a call's inputs, against the candidate's read from its memory (a copy keeps a dense tensor's strides, so its
    memory order is the worker's)."""
    tensors = list(output) if isinstance(output, list | tuple) else [output]
    digest = hashlib.blake2b()
    for tensor in tensors:
        if type(tensor) is not torch.Tensor:
            raise TypeError(f"a saved output of {type(tensor).__name__}")
        values = tensor.detach().resolve_conj().resolve_neg()
        raw = (in_memory_order(values) if dense(values) else values.contiguous().reshape(-1)).view(torch.uint8)
        digest.update(raw.numel().to_bytes(8, "little"))
        digest.update(raw.numpy().data)  # a contiguous view, hashed where it lies: no copy of the output
    return digest.hexdigest()
