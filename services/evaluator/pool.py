"""Single-use worker processes: spawn (ahead of time, torch already imported), talk to, kill, clean up.

Each job gets a fresh `python -m services.evaluator.worker`; after the job every process it left is killed and
its directory removed, so nothing a job does can reach the next one.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import logging
import math
import os
import secrets
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from services.evaluator import build_cache, job_cgroup, sandbox
from services.evaluator.config import Settings
from services.evaluator.device_memory import WORKER_CONTEXT_BYTES, DeviceMemory
from services.evaluator.safe_files import remove_tree

log = logging.getLogger(__name__)

REPO_ROOT = Path(__file__).resolve().parents[2]
STARTUP_TIMEOUT_S = 120.0
WORK_DIR_PREFIX = "kernel-agent-evaluator-"
WORK_DIR_MODE = 0o711
MAX_EVENT_BYTES = 16 << 20
# Event lines longer than this are parsed in a thread (the replies the judge times are far shorter).
INLINE_EVENT_BYTES = 64 << 10
# What _parse_event gives for a line that is not an event a worker may send (the judge sees a flood).
FLOODED = object()
STDIO_TAIL_BYTES = 16_384
# Nice value of workers while they start and wait idle: below every evaluation that is being timed.
IDLE_NICE = 10
# How often the service kills and reaps job processes re-parented to it (sandbox.kill_escaped).
ORPHAN_SWEEP_PERIOD_S = 0.25
# How long closing the pool waits for those it kills last to exit.
CLOSE_REAP_S = 5.0
# A job disk of this many of the largest files a job may write, where its size is not set: the largest file beside
# inputs (or a timer's copies of checks) of up to three such files.
JOB_DISK_FILES = 4


def uid_count(workers: int) -> int:
    """Sandbox uids a service with `workers` slots may hold at once: per slot, two idle workers, the reference,
    candidate, timer and builder workers of a running evaluation, and the replacements being spawned."""
    return 10 * workers + 8


class QueueFullError(RuntimeError):
    """More evaluations are waiting than `max_queued` allows."""


class WorkerStartError(RuntimeError):
    """A worker died or hung before it was ready; the evaluator's fault, not the job's."""


@dataclass
class WorkerOutcome:
    returncode: int | None
    timed_out: bool
    stdio_tail: str
    # Why the service killed the job, where it did (the memory limit, a job that resisted a stop).
    killed_for: str | None = None

    def describe_exit(self) -> str:
        if self.killed_for is not None:
            return f"killed for {self.killed_for}"
        if self.returncode is None:
            return "did not exit"
        if self.returncode < 0:
            try:
                name = signal.Signals(-self.returncode).name
            except ValueError:
                name = f"signal {-self.returncode}"
            return f"killed by {name}"
        return f"exited with code {self.returncode}"


@dataclass(eq=False)
class Worker:
    """One spawned worker process and its private directory."""

    proc: asyncio.subprocess.Process
    device: str
    root: Path
    home: Path
    uid: int | None
    # Strict isolation: stops and kills every process of the uid at once (sandbox.UidSignaller).
    signaller: sandbox.UidSignaller | None = None
    events: list[dict[str, Any]] = field(default_factory=list)
    changed: asyncio.Event = field(default_factory=asyncio.Event)
    eof: bool = False
    reader: asyncio.Task[None] | None = None
    exit_watch: asyncio.Task[None] | None = None
    killed_for: str | None = None
    gpu: str | None = None
    cursor: int = 0
    # The kernel's count of the job's memory and CPU, where the host gives the service cgroups (job_cgroup).
    cgroup: job_cgroup.JobCgroup | None = None
    # The service's own read-only descriptor of the worker's stdio.log, opened when it made the file: in `process`
    # isolation the job may write the directory the log is in, and put a FIFO there (an open of the path blocked
    # the service's event loop for good) or a link to any file the service may read (shown in the verdict).
    stdio: int = -1
    # The service's end of the worker's handover socket, on a GPU (device_handover).
    handover: socket.socket | None = None
    # Its directories as made (_dir_identities), which an idle worker's must still be when it is taken.
    made_dirs: list[tuple[int, int, int, bool] | None] = field(default_factory=list)
    # The device number of its directory where that is a disk of its own (EVALUATOR_JOB_DISK_MB), and the bytes the
    # service put there (inputs, copies of the candidate's checks), which count against the job's memory nowhere
    # (MemoryWatch): raised before each write, lowered only for a write that left nothing, so never below what
    # those files hold.
    disk_device: int | None = None
    disk_service_bytes: int = 0
    # The job's memory limit, against which its files on that disk count (MemoryWatch, note_files_past_limit).
    memory_limit_mb: int | None = None

    def charge_service_write(self, size: int) -> None:
        """The service is about to put `size` bytes on the worker's own disk (where it has one)."""
        if self.disk_device is not None:
            self.disk_service_bytes += sandbox.disk_bytes(size)

    def release_service_write(self, size: int) -> None:
        """The service did not write `size` bytes it had charged."""
        if self.disk_device is not None:
            self.disk_service_bytes = max(0, self.disk_service_bytes - sandbox.disk_bytes(size))

    async def send(self, message: dict[str, Any]) -> None:
        assert self.proc.stdin is not None
        with contextlib.suppress(ConnectionError):
            self.proc.stdin.write((json.dumps(message) + "\n").encode())
            await self.proc.stdin.drain()

    def find(self, name: str) -> dict[str, Any] | None:
        return next((event for event in self.events if event.get("event") == name), None)

    async def expect(self, names: set[str], deadline: float, nonce: str | None = None) -> dict[str, Any] | None:
        """The next event named in `names` after those already expected (carrying `nonce` if given); None once
        the worker exited, stopped talking or the deadline passed. Events in between are skipped: a candidate
        can write any line on its channel, so a reply counts only where the judge asked for one."""
        drained = False
        while True:
            for index in range(self.cursor, len(self.events)):
                event = self.events[index]
                if event.get("event") in names and (nonce is None or event.get("nonce") == nonce):
                    self.cursor = index + 1
                    return event
            if self.eof or drained or time.monotonic() >= deadline:
                return None
            if self.proc.returncode is not None:
                # Exit counts, not only EOF (children a job forked may hold the pipe open); read what is left.
                drained = True
                if self.reader is not None:
                    with contextlib.suppress(Exception):
                        await asyncio.wait_for(asyncio.shield(self.reader), 0.5)
                continue
            self.changed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.changed.wait(), deadline - time.monotonic())

    async def wait_for(self, names: set[str], deadline: float) -> dict[str, Any] | None:
        """First event named in `names`; None once the worker exited, stopped talking or the deadline passed."""
        drained = False
        while True:
            found = next((event for event in self.events if event.get("event") in names), None)
            if found is not None or self.eof or drained:
                return found
            if self.proc.returncode is not None:
                # Exit counts, not only EOF (children a job forked may hold the pipe open); read what is left.
                drained = True
                if self.reader is not None:
                    with contextlib.suppress(Exception):
                        await asyncio.wait_for(asyncio.shield(self.reader), 0.5)
                continue
            self.changed.clear()
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return None
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.changed.wait(), remaining)

    async def finish(self, deadline: float) -> WorkerOutcome:
        """Wait for exit until `deadline`, then kill whatever the job left and collect the last events."""
        timed_out = False
        try:
            await asyncio.wait_for(self.proc.wait(), max(0.0, deadline - time.monotonic()))
        except TimeoutError:
            timed_out = True
        await asyncio.to_thread(sandbox.kill_all, self.uid, self.proc.pid, self.signaller)
        await self.proc.wait()
        self.note_out_of_memory()
        self.note_files_past_limit()
        if self.reader is not None:
            with contextlib.suppress(Exception, asyncio.CancelledError):
                await asyncio.wait_for(asyncio.shield(self.reader), 2.0)
            self.reader.cancel()
        return WorkerOutcome(self.proc.returncode, timed_out, self._stdio_tail(), self.killed_for)

    def note_out_of_memory(self) -> bool:
        """Whether the kernel killed a process of the job at its cgroup's memory limit; if so, that is what the job
        was killed for. Read again at the end: a helper killed there may leave the worker to answer."""
        if self.cgroup is None or self.killed_for is not None:
            return False
        with contextlib.suppress(OSError, ValueError):
            if self.cgroup.oom_kills():
                self.killed_for = f"using more than {self.cgroup.memory_limit_mb} MB of memory (its cgroup's count)"
                return True
        return False

    def note_files_past_limit(self) -> None:
        """Whether the files the job left on its own disk, where no cgroup counts them, exceed its memory limit by
        themselves; if so, that is what the job was killed for. The watch samples every half second: a job that
        wrote 1.5 GB against a 1 GiB limit and ended within one period scored `correct` (`make test-docker`)."""
        if self.killed_for is None and self.memory_limit_mb is not None:
            if _files_in_memory(self) > self.memory_limit_mb << 20:
                self.killed_for = f"using more than {self.memory_limit_mb} MB of resident memory and files on its disk"

    def _stdio_tail(self) -> str:
        with contextlib.suppress(OSError):
            size = os.fstat(self.stdio).st_size
            start = max(0, size - STDIO_TAIL_BYTES)
            return os.pread(self.stdio, size - start, start).decode(errors="replace")
        return ""


# Deepest nesting of lists and dicts in a worker's event (a block digest nests 4 deep).
MAX_EVENT_DEPTH = 32


def _bounded_int(text: str) -> int | float:
    """A JSON integer; one too large for a float (which no honest reply carries) reads as infinity, so every
    check of a number's finiteness rejects it instead of raising OverflowError."""
    return int(text) if len(text.lstrip("-")) <= 300 else math.inf


def _nested_deeper(value: Any, limit: int) -> bool:
    """Whether lists and dicts in `value` nest more than `limit` deep (walked without recursion)."""
    stack = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, list | dict):
            if depth >= limit:
                return True
            stack.extend((child, depth + 1) for child in (item.values() if isinstance(item, dict) else item))
    return False


def _parse_event(line: bytes) -> Any:
    """One event line as JSON; FLOODED where it is not JSON or nests deeper than MAX_EVENT_DEPTH."""
    try:
        event = json.loads(line, parse_int=_bounded_int)
    except (ValueError, RecursionError):  # a line nested 200,000 deep must not end the reader
        return FLOODED
    # Parsed here, near the bottom of the stack, a value nested ~1000 deep still raises RecursionError wherever the
    # judge later prints or walks it (an error message): a flood, never evaluator_error.
    return FLOODED if _nested_deeper(event, MAX_EVENT_DEPTH) else event


async def _read_events(worker: Worker, reader: asyncio.StreamReader) -> None:
    total = 0
    try:
        while True:
            line = await reader.readline()
            if not line:
                break
            total += len(line)
            if total > MAX_EVENT_BYTES:
                worker.events.append({"event": "flood", "received_at": time.monotonic()})
                break
            # A long line is parsed off the event loop: a red-team job's one line of 16 MiB (millions of empty
            # lists) took 6 s to parse and walk, and the service answered nothing meanwhile (/health: 13.5 s).
            event = (
                await asyncio.to_thread(_parse_event, line) if len(line) > INLINE_EVENT_BYTES else _parse_event(line)
            )
            if event is FLOODED:
                worker.events.append({"event": "flood", "received_at": time.monotonic()})
                continue
            # Only events named by a string reach the judge: any other name (a list, a dict) would make its
            # lookups raise, and an exception there is not the candidate's verdict to choose.
            if isinstance(event, dict) and isinstance(event.get("event"), str):
                event["received_at"] = time.monotonic()
                worker.events.append(event)
                worker.changed.set()
    except (ValueError, ConnectionError, asyncio.LimitOverrunError):
        worker.events.append({"event": "flood", "received_at": time.monotonic()})
    finally:
        worker.eof = True
        worker.changed.set()


async def _watch_exit(worker: Worker) -> None:
    await worker.proc.wait()
    worker.changed.set()


def _remove_stale_work_dirs(parent: Path) -> None:
    """Remove work dirs of evaluators that died without cleaning up (their pid is in the name), and their workers'
    disks (job_disk_mb) first: `rm` does not cross into another filesystem."""
    parent = parent.resolve()
    for path in parent.glob(f"{WORK_DIR_PREFIX}*-*"):
        pid = path.name[len(WORK_DIR_PREFIX) :].split("-", 1)[0]
        if not pid.isdigit() or Path(f"/proc/{pid}").exists():
            continue
        # Never followed: anyone may write a shared parent such as /tmp, and a link planted there under a dead
        # service's name had the service detach every mount beneath the link's target.
        info = os.lstat(path)
        if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.geteuid():
            continue
        if os.geteuid() == 0:
            sandbox.detach_mounts(path)
        remove_tree(path)


def _job_disks(settings: Settings, strict: bool, work_dir: Path) -> int | None:
    """The size of each worker's own disk (sandbox.mount_job_disk) where strict isolation has one: None where it is
    off or this host refuses the mount (no CAP_SYS_ADMIN, an AppArmor profile that denies mounts), with a warning.
    Unset, on where the work directory is a tmpfs: its files are memory already, and a job that filled it would
    fail every evaluation beside it (Debian 13 and Fedora mount /tmp, the default work directory, so)."""
    size_mb = settings.job_disk_mb
    if size_mb is None:
        size_mb = JOB_DISK_FILES * settings.max_file_mb if sandbox.filesystem_type(work_dir) == "tmpfs" else 0
    if not strict or size_mb == 0:
        return None
    probe = sandbox.make_dir(work_dir / "disk-probe", 0o711)
    try:
        sandbox.mount_job_disk(probe, 1)
    except OSError as error:
        log.warning("no disk of its own per job (%s): a job can fill the filesystem of %s", error, work_dir)
        return None
    finally:
        sandbox.detach_mounts(probe)
        probe.rmdir()
    return size_mb


class MemoryWatch:
    """Kills a job whose processes together hold more than `limit_mb` resident, unless its cgroup is all the limit
    it needs (_counted_by_cgroup), and the rest of a job that lost a process to its cgroup's limit: the memory limit
    of workers without RLIMIT_AS (CUDA maps far more virtual memory than it uses), and a backstop for the others.
    One scan of /proc per period serves every watched job: with a scan per job, 16 evaluations on a GPU host kept
    the service's interpreter busy with little else."""

    def __init__(self, limit_mb: int, period_s: float = 0.5) -> None:
        self.limit_mb, self.period_s = limit_mb, period_s
        self.workers: set[Worker] = set()
        self.task: asyncio.Task[None] | None = None

    def watch(self, worker: Worker) -> None:
        self.workers.add(worker)
        if self.task is None:
            self.task = asyncio.create_task(self._run())

    def forget(self, worker: Worker) -> None:
        self.workers.discard(worker)

    async def _run(self) -> None:
        while self.workers:
            try:
                for worker in await asyncio.to_thread(self._over_limit, list(self.workers)):
                    self.workers.discard(worker)
                    await asyncio.to_thread(sandbox.kill_all, worker.uid, worker.proc.pid, worker.signaller)
            except Exception:
                # One watch serves every job: a failed period must not end the memory limit of all of them.
                log.exception("the memory watch failed; it goes on")
            await asyncio.sleep(self.period_s)
        self.task = None  # no await since the check: a worker watched from now on starts a new task

    def _over_limit(self, workers: list[Worker]) -> list[Worker]:
        """Workers whose job lost a process to its cgroup's limit (the kernel killed only that process on a cgroup
        v1: the rest of the job goes too), or holds more than the limit resident. The cgroup's count alone is the
        limit of a CPU job in strict isolation (_counted_by_cgroup): a sum of resident sets counts a page that
        forked processes share once for each of them (an honest job with 100 forks of a worker read as more than
        6 GB and was killed)."""
        summed = [worker for worker in workers if not _counted_by_cgroup(worker)]
        table = sandbox.process_table() if summed else {}
        over = []
        for worker in workers:
            if worker.note_out_of_memory():
                over.append(worker)
            elif worker in summed and worker.proc.returncode is None:
                held = sandbox.resident_bytes(worker.uid, worker.proc.pid, table)
                on_disk = _files_in_memory(worker)
                if held + on_disk > self.limit_mb << 20:
                    files = " and files on its disk" if on_disk else ""
                    worker.killed_for = f"using more than {self.limit_mb} MB of resident memory{files}"
                    over.append(worker)
        return over


def _files_in_memory(worker: Worker) -> int:
    """Bytes of the job's own files on its disk where that disk is memory no cgroup counts: a job disk (a tmpfs)
    of a worker without a cgroup. Without this, a job's files there were memory beyond its limit (a red-team job
    wrote 1.5 GB against a 1 GiB limit and scored `correct`). What the service put there is not the job's, and the
    job cannot remove it (the `inputs` directory it is in is the service's, read-only)."""
    if worker.disk_device is None or worker.cgroup is not None:
        return 0
    # None once the disk is detached (the worker disposed of meanwhile): the filesystem below is not the job's.
    used = sandbox.disk_used_bytes(worker.root, worker.disk_device)
    return 0 if used is None else max(0, used - worker.disk_service_bytes)


def _counted_by_cgroup(worker: Worker) -> bool:
    """Whether the job's cgroup is all the memory limit it needs: a CPU job under a uid of its own, which cannot
    write its group's root-owned files (in process isolation with a delegated cgroup v2 subtree the job could raise
    its own `memory.max`), and whose memory the group surely counts (a CUDA worker's pinned host memory may not be
    charged to it; not measured)."""
    return worker.cgroup is not None and worker.uid is not None and worker.device == "cpu"


def _waiting_to_run(pid: int) -> bool:
    """Whether an idle worker can take a job: its process exists and has not exited (a job in process isolation,
    under the same uid, may have killed it: the kill is seen here before the event loop has reaped the process).
    One that was stopped (the same job's SIGSTOP) is resumed."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            state = stat.read().rsplit(b")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    if state in (b"T", b"t"):
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGCONT)
    return state not in (b"Z", b"X", b"x")


def _dir_identities(worker: Worker) -> list[tuple[int, int, int, bool] | None]:
    """Device, inode, mode and whether it has an ACL, of each of a worker's directories (None for one that is not a
    directory)."""
    identities: list[tuple[int, int, int, bool] | None] = []
    for path in (worker.root, worker.home):
        try:
            info = os.lstat(path)
        except OSError:
            identities.append(None)
            continue
        identities.append(
            (info.st_dev, info.st_ino, info.st_mode, sandbox.has_acl(path)) if stat.S_ISDIR(info.st_mode) else None
        )
    return identities


def _untouched(worker: Worker) -> bool:
    """Whether an idle worker's directories are as _spawn made them: the same directories with the same modes and no
    ACL, and no `inputs` in its home yet. A job in process isolation, under the same uid, may have made them
    read-only (by their modes or by a default ACL the service's new files inherit), replaced them, or planted the
    entry the service makes when it hands a worker its files; the evaluation that took the worker as its timer
    would then be rejected for what a job that has ended did."""
    return _dir_identities(worker) == worker.made_dirs and not os.path.lexists(worker.home / "inputs")


class WorkerPool:
    """Spawns workers under the sandbox, keeps `workers` of them idle per device, bounds concurrent evaluations."""

    def __init__(self, settings: Settings, strict: bool, memory_readable: bool = True) -> None:
        self.settings = settings
        self.strict = strict
        # Whether the service read a worker's memory at start-up (held_memory.memory_unreadable_reason).
        self.memory_readable = memory_readable
        _remove_stale_work_dirs(Path(settings.work_dir or tempfile.gettempdir()))
        # Resolved: a worker's sandbox covers directories (/tmp) through which a link to the work directory leads.
        self.work_dir = Path(
            tempfile.mkdtemp(prefix=f"{WORK_DIR_PREFIX}{os.getpid()}-", dir=settings.work_dir)
        ).resolve()
        sandbox.set_plain_mode(self.work_dir, WORK_DIR_MODE)
        self.uids = sandbox.UidPool(settings.sandbox_uid_base, uid_count(settings.workers)) if strict else None
        self.signaller = sandbox.UidSignaller(self.uids.signaller_uid) if self.uids is not None else None
        self._slots = asyncio.Semaphore(settings.workers)
        self._idle: dict[tuple[str, str | None], list[Worker]] = {}
        self._active: set[Worker] = set()
        self._refill: set[asyncio.Task[None]] = set()
        self._counter = itertools.count()
        self._warned_device_hash = False
        self.waiting = 0
        self.running = 0
        build_cache.prepare(settings.cache_dir)
        self.gpus = _visible_gpus() or ["0"]
        self._next_gpu = itertools.cycle(self.gpus)
        # The judge holds a GPU's lock while models run on it, so timings never share a GPU; builds go on meanwhile.
        self.gpu_locks = {gpu: asyncio.Lock() for gpu in self.gpus}
        # Each GPU's memory, reserved by evaluations (device_memory); its size comes with the first worker started there.
        limit = settings.device_memory_mb << 20 if settings.device_memory_mb is not None else None
        self.device_memory = {gpu: DeviceMemory(limit) for gpu in self.gpus}
        self.timing_cpus = timing_cpus(settings.timing_cpus, self.gpus)
        self._builds = asyncio.Semaphore(settings.build_workers)
        self._pch_build = _start_pch_build(settings.cache_dir)
        self.memory_watch = MemoryWatch(settings.memory_limit_mb)
        self.cgroups = job_cgroup.JobCgroups.create(settings.memory_limit_mb) if settings.job_cgroups else None
        self.job_disk_mb = _job_disks(settings, strict, self.work_dir)
        # Job processes whose parent exits come to the service, which kills and reaps them (_sweep_orphans): in
        # process isolation those of a worker that exited first; in strict isolation pid 1 of a namespace whose
        # relay was killed first, which would otherwise wait as a zombie for an init that may never reap it.
        self._spawned: dict[int, asyncio.subprocess.Process] = {}
        self._orphan_sweep: asyncio.Task[None] | None = None
        sandbox.adopt_orphans()

    def placement(self, device: str) -> str | None:
        """The GPU an evaluation's workers share (round robin), None on CPU."""
        return next(self._next_gpu) if device == "cuda" else None

    async def prespawn(self, device: str) -> None:
        """Fill the idle lists of `device` up to two workers (a candidate and a reference timer) per slot."""
        if not self.settings.prespawn:
            return
        gpus: list[str | None] = list(self.gpus) if device == "cuda" else [None]
        per_key = self._idle_per_gpu() if device == "cuda" else 2 * self.settings.workers
        for gpu in gpus:
            idle = self._idle.setdefault((device, gpu), [])
            while len(idle) < per_key:
                idle.append(await self._spawn(device, gpu))

    def _idle_per_gpu(self) -> int:
        """Idle workers prespawned per GPU (two per slot, the GPUs sharing them)."""
        return -(-2 * self.settings.workers // len(self.gpus)) if self.settings.prespawn else 0

    @contextlib.asynccontextmanager
    async def build_slot(self) -> AsyncIterator[None]:
        """One of `build_workers` extension builds; held by the service, out of every candidate's reach."""
        async with self._builds:
            yield

    @contextlib.asynccontextmanager
    async def slot(self) -> AsyncIterator[None]:
        """One of `workers` evaluation slots; callers beyond `max_queued` get QueueFullError."""
        if self.waiting >= self.settings.max_queued:
            raise QueueFullError(f"{self.waiting} evaluations are already waiting")
        self.waiting += 1
        try:
            await self._slots.acquire()
        finally:
            self.waiting -= 1
        self.running += 1
        try:
            yield
        finally:
            self.running -= 1
            self._slots.release()

    @contextlib.asynccontextmanager
    async def worker(self, device: str, gpu: str | None = None) -> AsyncIterator[Worker]:
        """A ready, unused worker for `device` (on `gpu`); killed and removed on exit, and a fresh one spawned to
        replace it."""
        worker = await self._take(device, gpu)
        self._active.add(worker)
        self.memory_watch.watch(worker)
        try:
            yield worker
        finally:
            self.memory_watch.forget(worker)
            self._active.discard(worker)
            await self._dispose(worker)

    async def _take(self, device: str, gpu: str | None) -> Worker:
        idle = self._idle.setdefault((device, gpu), [])
        worker = None
        while idle and worker is None:
            candidate = idle.pop(0)
            if candidate.proc.returncode is None and _waiting_to_run(candidate.proc.pid) and _untouched(candidate):
                worker = candidate
            else:
                await self._dispose(candidate)
        if worker is None:
            worker = await self._spawn(device, gpu)
        if self.settings.prespawn:
            task = asyncio.create_task(self._refill_one(device, gpu))
            self._refill.add(task)
            task.add_done_callback(self._refill.discard)
        # Ahead of the idle workers before it is ready: an evaluation waits for it now.
        if os.geteuid() == 0:
            await asyncio.to_thread(_renice, worker, 0)
        if worker.cgroup is not None:
            await asyncio.to_thread(worker.cgroup.weigh, job_cgroup.TAKEN_WEIGHT)
        await self._wait_ready(worker)
        return worker

    async def _refill_one(self, device: str, gpu: str | None) -> None:
        try:
            self._idle.setdefault((device, gpu), []).append(await self._spawn(device, gpu))
        except Exception:
            log.exception("could not spawn an idle %s worker", device)

    async def _wait_ready(self, worker: Worker) -> None:
        event = await worker.wait_for({"ready", "error"}, time.monotonic() + STARTUP_TIMEOUT_S)
        if event is None or event["event"] != "ready":
            self._active.discard(worker)
            await self._dispose(worker)
            detail = event.get("message", "") if event else "no answer"
            raise WorkerStartError(f"worker did not start: {detail}"[-2000:])
        if worker.cgroup is not None:
            # Only the worker's own code has run so far: its process tree (the relay and pid 1 of its namespace in
            # strict isolation) must already be in its group. Not the uid's processes: a process a killed job left
            # exiting under a uid leased again (a zombie is in no group) would fail an honest start.
            pids = await asyncio.to_thread(sandbox.job_pids, None, [worker.proc.pid])
            outside = set(pids) - await asyncio.to_thread(worker.cgroup.member_pids)
            if outside:
                self._active.discard(worker)
                await self._dispose(worker)
                raise WorkerStartError(f"worker processes {sorted(outside)} are not in the job's cgroup")
        total = event.get("device_memory_bytes")
        if worker.gpu is not None and type(total) is int and total > 0:
            # Sent before any job's code ran. Outside every reservation: a context for every idle worker and builder.
            unreserved = (self._idle_per_gpu() + self.settings.build_workers) * WORKER_CONTEXT_BYTES
            await self.device_memory[worker.gpu].learn_capacity(total - unreserved)
        if event.get("device_hash_unavailable") and not self._warned_device_hash:
            # Sent before any job's code ran in the worker. Sketches stay sound (the same hash, on the host), slower.
            self._warned_device_hash = True
            log.warning("GPU outputs are hashed on the host: %s", str(event["device_hash_unavailable"])[:500])

    def _child_env(self, home: Path, gpu: str | None, threads: int) -> dict[str, str]:
        env = sandbox.child_env(home, self.settings.build_jobs, threads)
        if gpu is not None:
            # One GPU per worker; the worker sees it as cuda:0.
            env["CUDA_VISIBLE_DEVICES"] = gpu
        return env

    async def _spawn(self, device: str, gpu: str | None = None) -> Worker:
        from services.evaluator.backends import get_backend

        uid = self.uids.lease() if self.uids is not None else None
        if not self.strict:
            # A job under the service's uid may have changed the directory every worker is made in.
            sandbox.set_plain_mode(self.work_dir, WORK_DIR_MODE)
        root = sandbox.make_dir(self.work_dir / f"w{next(self._counter)}-{secrets.token_hex(4)}", 0o711)
        if self.job_disk_mb is not None:
            sandbox.mount_job_disk(root, self.job_disk_mb)
        home = sandbox.make_private_dir(root / "home", uid)
        limits_memory = getattr(get_backend(device), "limits_address_space", False)
        cgroup = await asyncio.to_thread(self.cgroups.make, root.name) if self.cgroups is not None else None
        spec = sandbox.SandboxSpec(
            home=str(home),
            strict=self.strict,
            uid=uid,
            memory_bytes=self.settings.memory_limit_mb << 20 if limits_memory else None,
            max_processes=self.settings.max_processes,
            max_file_bytes=self.settings.max_file_mb << 20,
            keep_paths=(str(self.settings.cache_dir), str(REPO_ROOT)),
            cgroup_procs=cgroup.procs_files if cgroup is not None else (),
            cuda=device == "cuda",
            jobs_parent=str(self.work_dir.parent),
        )
        threads = self.settings.threads_per_worker
        read_fd, write_fd = os.pipe()
        # On a GPU, a socket for checked outputs handed over in device memory (device_handover).
        handover, worker_end = (
            socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET) if device == "cuda" else (None, None)
        )
        handover_args = ["--handover-fd", str(worker_end.fileno())] if worker_end is not None else []
        # The service's alone (the worker writes it through the descriptor it inherits): another job that knew its
        # path would read this job's output, in strict isolation too where the work directory is outside /tmp.
        with open(root / "stdio.log", "xb", opener=lambda path, flags: os.open(path, flags, 0o600)) as stdio:
            stdio_reader = os.open(root / "stdio.log", os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
            try:
                proc = await asyncio.create_subprocess_exec(
                    sys.executable,
                    "-P",
                    "-m",
                    "services.evaluator.worker",
                    "--spec",
                    spec.to_arg(),
                    "--events-fd",
                    str(write_fd),
                    "--device",
                    device,
                    "--threads",
                    str(threads),
                    "--cache-dir",
                    str(self.settings.cache_dir),
                    *handover_args,
                    stdin=asyncio.subprocess.PIPE,
                    stdout=stdio,
                    stderr=stdio,
                    cwd=home,
                    pass_fds=(write_fd,) if worker_end is None else (write_fd, worker_end.fileno()),
                    env=self._child_env(home, gpu, threads),
                    start_new_session=True,
                )
            except BaseException:
                os.close(stdio_reader)
                if handover is not None:
                    handover.close()
                raise
            finally:
                if worker_end is not None:
                    worker_end.close()
        os.close(write_fd)
        self._spawned[proc.pid] = proc  # pruned by the sweep
        if self._orphan_sweep is None:
            self._orphan_sweep = asyncio.create_task(self._sweep_orphans())
        if handover is not None:
            handover.setblocking(False)
        if os.geteuid() == 0:
            # Idle workers start (import torch) behind the evaluations that run: only root can undo a nice value,
            # which _take does when the worker gets a job.
            with contextlib.suppress(OSError):
                os.setpriority(os.PRIO_PROCESS, proc.pid, IDLE_NICE)
        worker = Worker(
            proc=proc,
            device=device,
            root=root,
            home=home,
            uid=uid,
            gpu=gpu,
            signaller=self.signaller,
            cgroup=cgroup,
            stdio=stdio_reader,
            handover=handover,
            disk_device=os.stat(root).st_dev if self.job_disk_mb is not None else None,
            memory_limit_mb=self.settings.memory_limit_mb,
        )
        worker.made_dirs = _dir_identities(worker)
        loop = asyncio.get_running_loop()
        stream = asyncio.StreamReader(limit=MAX_EVENT_BYTES, loop=loop)
        await loop.connect_read_pipe(
            lambda: asyncio.StreamReaderProtocol(stream, loop=loop), os.fdopen(read_fd, "rb", buffering=0)
        )
        worker.reader = asyncio.create_task(_read_events(worker, stream))
        worker.exit_watch = asyncio.create_task(_watch_exit(worker))
        return worker

    async def _dispose(self, worker: Worker) -> None:
        try:
            if worker.proc.returncode is None or worker.uid is not None:
                await asyncio.to_thread(sandbox.kill_all, worker.uid, worker.proc.pid, worker.signaller)
            with contextlib.suppress(ProcessLookupError):
                await worker.proc.wait()
            for task in (worker.reader, worker.exit_watch):
                if task is not None:
                    task.cancel()
            if self.job_disk_mb is not None:
                await asyncio.to_thread(sandbox.detach_mounts, worker.root)
            await asyncio.to_thread(remove_tree, worker.root)
        finally:
            # Never read again: the number may soon name another file the service opens.
            stdio, worker.stdio = worker.stdio, -1
            with contextlib.suppress(OSError):
                # Off the event loop: the log may hold the last reference to the job's disk, and the kernel frees
                # the whole disk in this close (a red-team job's 2.5 million files took the service away for 9 s).
                await asyncio.to_thread(os.close, stdio)
            if worker.handover is not None:
                worker.handover.close()
            # Whatever failed above, the job's cgroup and uid go back: a lease lost per failure ends the pool.
            if worker.cgroup is not None and self.cgroups is not None:
                await asyncio.to_thread(self.cgroups.release, worker.cgroup)
            if worker.uid is not None and self.uids is not None:
                self.uids.release(worker.uid)

    async def _sweep_orphans(self) -> None:
        """Kill and reap, four times a second, every job process re-parented to the service: out of its worker's
        process tree, the judge's stops and the kill after its job missed it, and it outlived its job (a red-team
        daemon, double-forked with `setsid`, held 60,000 open files after its job had ended); left to an init that
        does not reap (a CI container's, or the service itself as a container's pid 1), the zombies of killed
        strict-isolation workers piled up and counted against their uids' process limits. A worker's pid counts as
        one until asyncio has reaped it."""
        while True:
            self._spawned = {pid: proc for pid, proc in self._spawned.items() if proc.returncode is None}
            try:
                await asyncio.to_thread(sandbox.kill_escaped, set(self._spawned))
            except Exception:
                log.exception("the sweep for escaped job processes failed; it goes on")
            await asyncio.sleep(ORPHAN_SWEEP_PERIOD_S)

    async def close(self) -> None:
        for task in [*self._refill, self.memory_watch.task, self._orphan_sweep]:
            if task is not None:
                task.cancel()
        workers = [w for idle in self._idle.values() for w in idle] + list(self._active)
        self._idle.clear()
        for worker in workers:
            with contextlib.suppress(Exception):
                await self._dispose(worker)
        # What the disposed workers left (each pid 1 of its namespace, in strict isolation) is the service's now.
        await asyncio.to_thread(sandbox.kill_escaped, set(), CLOSE_REAP_S)
        if self.job_disk_mb is not None:  # a worker whose start failed after its disk was mounted
            sandbox.detach_mounts(self.work_dir)
        remove_tree(self.work_dir)
        if self._pch_build is not None and self._pch_build.poll() is None:
            self._pch_build.terminate()
        if self.signaller is not None:
            self.signaller.close()
        if self.cgroups is not None:
            self.cgroups.close()


def _renice(worker: Worker, nice: int) -> None:
    """Set the nice value of every thread of the worker's processes."""
    for proc in sandbox.processes_of(worker.uid, [worker.proc.pid]):
        with contextlib.suppress(OSError):
            for task in os.listdir(f"/proc/{proc.pid}/task"):
                with contextlib.suppress(OSError):
                    os.setpriority(os.PRIO_PROCESS, int(task), nice)


def timing_cpus(chosen: list[int] | None, gpus: list[str]) -> dict[str, int]:
    """The core each GPU's timed workers are pinned to: `chosen` in GPU order (cycled), or the service's last allowed
    cores, one per GPU."""
    allowed = sorted(os.sched_getaffinity(0))
    if chosen is None:
        chosen = [allowed[-1 - index % len(allowed)] for index in range(len(gpus))]
    outside = sorted(set(chosen) - set(allowed))
    if outside:
        raise ValueError(
            f"EVALUATOR_TIMING_CPUS names cores {outside} this service may not run on (allowed: {allowed})"
        )
    return {gpu: chosen[index % len(chosen)] for index, gpu in enumerate(gpus)} if chosen else {}


def _visible_gpus() -> list[str]:
    """GPU ids the service may hand out: its own CUDA_VISIBLE_DEVICES, else every GPU torch sees."""
    visible = [v.strip() for v in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if v.strip()]
    if visible:
        return visible
    import torch

    return [str(i) for i in range(torch.cuda.device_count())] if torch.cuda.is_available() else []


def _start_pch_build(cache_dir: Path) -> subprocess.Popen[bytes] | None:
    """Build the torch-header PCH for the default CUDA flags in the background (trusted code, see pch.py)."""
    import torch

    if not torch.cuda.is_available():
        return None
    cache_dir.mkdir(parents=True, exist_ok=True)
    with open(cache_dir / "pch-build.log", "ab") as log_file:
        return subprocess.Popen(
            [
                sys.executable,
                "-m",
                "services.evaluator.pch",
                str(cache_dir),
                *build_cache.build_flags("cuda")["extra_cflags"],
            ],
            cwd=REPO_ROOT,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env=sandbox.tool_env(),
        )
