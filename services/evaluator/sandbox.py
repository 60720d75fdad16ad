"""What a worker process gets: private directory, stripped environment, rlimits, a cgroup where the host gives one
(job_cgroup), a Landlock domain of its own (landlock), sockets of the unix and inet families only (syscall_filter),
and in `strict` isolation namespaces of its own (pid, IPC, mount, network), private world-writable directories,
every other mount read-only and an unprivileged uid.

`enter()` runs inside the child before any untrusted code; the rest runs in the service.

Strict isolation splits the spawned process in two. The process the service started (its pid is the one the
service knows) stays outside a new pid namespace as a root-owned relay: it waits for its only child and exits
with the child's status (or dies by the same signal). The child is pid 1 of the new pid namespace and goes on as
the worker. Both have PR_SET_PDEATHSIG=SIGKILL, so SIGKILL on the relay (the service's `kill_all`, or the
service dying) kills the worker, and when the worker (pid 1) dies the kernel kills every process of its
namespace: nothing a job starts, `setsid` daemons included, outlives it. pid 1 only gets signals it has a
handler for, SIGKILL from outside excepted: SIGINT is ignored (a candidate's worker gets Python's handler back), and SIGTERM,
SIGHUP, SIGALRM, SIGUSR1 and SIGUSR2 get one that exits with 128 + the signal number. A worker's own abort()
therefore ends in glibc's fallback, a SIGSEGV, instead of SIGABRT; faults (SIGSEGV, SIGBUS, SIGILL, SIGFPE)
kill pid 1 as they kill any process.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import logging
import os
import re
import resource
import select
import signal
import stat
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

from services.evaluator import landlock, syscall_filter

if TYPE_CHECKING:
    from collections.abc import Iterable

    import psutil

log = logging.getLogger(__name__)

CLONE_NEWNS = 0x00020000
CLONE_NEWIPC = 0x08000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REMOUNT = 0x1, 0x2, 0x4, 0x8, 0x20
MS_BIND, MS_REC, MS_PRIVATE = 0x1000, 0x4000, 0x40000
MNT_DETACH = 0x2
# The mount source of each worker's disk (mount_job_disk), and the inodes it may hold per MiB of its size.
JOB_DISK_SOURCE = "kernel-agent-job-disk"
JOB_DISK_INODES_PER_MB = 64
# Per-mount options of /proc/self/mountinfo a read-only remount keeps (a remount replaces them all).
MOUNT_OPTION_FLAGS = {
    "nosuid": MS_NOSUID,
    "nodev": MS_NODEV,
    "noexec": MS_NOEXEC,
    "noatime": 0x400,
    "nodiratime": 0x800,
    "relatime": 0x200000,
    "strictatime": 0x1000000,
    "nosymfollow": 0x100,
}
PR_SET_PDEATHSIG = 1
PR_SET_DUMPABLE = 4
PR_SET_NO_NEW_PRIVS = 38
# Shared scratch places replaced by an empty, small tmpfs (of this many MiB) in strict isolation.
PRIVATE_TMPFS = ("/tmp", "/var/tmp", "/dev/shm")
PRIVATE_TMPFS_MB = 64
# A worker's /proc/self/oom_score_adj: the most, so the kernel's OOM killer takes a job before anything else.
OOM_SCORE_ADJ = 1000
# Other places every user may write to, made private as well (a smaller tmpfs; a fresh mqueue fs on /dev/mqueue).
SHARED_WRITABLE = ("/run/lock", "/var/lock", "/dev/mqueue")
# Directories whose sticky, world-writable subdirectories (mode 1777, e.g. /var/crash) are made private too.
SCAN_WRITABLE_IN = ("/", "/run", "/var", "/dev")
MQUEUE_DIR = "/dev/mqueue"
# System V IPC of a worker's own IPC namespace: 64 MiB of shared memory in all, few segments and queues.
SHM_BYTES = 64 << 20
# Open files per process of a job (soft and hard): the common default soft limit. Without it a job inherited the
# service's (a million under Docker) and a red-team candidate's processes held 400,000 files of the host's table,
# whose end makes every unprivileged open on the host fail; a job's processes are bounded by RLIMIT_NPROC.
MAX_OPEN_FILES = 1024
IPC_LIMITS = {
    "kernel/shmmax": SHM_BYTES,
    "kernel/shmall": SHM_BYTES // resource.getpagesize(),
    "kernel/shmmni": 32,
    "kernel/msgmni": 32,
}
# Bytes of /proc/<pid>/status read for its PPid and Uid lines (about 200 bytes in; the escaped name before them is
# at most 64 characters).
STATUS_HEAD_BYTES = 1024
PAGE_BYTES = resource.getpagesize()
# Signals pid 1 of a worker's pid namespace exits on (it would ignore them without a handler).
EXIT_SIGNALS = (signal.SIGTERM, signal.SIGHUP, signal.SIGALRM, signal.SIGUSR1, signal.SIGUSR2)
# A thread's flag in /proc/<pid>/task/<tid>/stat: it is exiting.
PF_EXITING = 0x4
# How long stopping a job may take before the job is taken for one that resists it (an honest job takes milliseconds;
# an exit that frees a large address space, a fraction of a second).
STOP_SETTLE_S = 5.0
# How long a stop waits for a thread waiting in the kernel (state D) to stop before taking it as settled. Such a wait
# can end in kernel work that no stop interrupts: a munmap that waited for the address space's lock (held by
# whoever reads the job's /proc files, the judge among them) went on to free 256 MB, and in 6 stops of 300 here the
# job used over 2 ms of CPU after its stop returned, which the judge takes for a job resumed behind its back
# (result_tampering). A thread that stays there is held by something the stop also holds (a vfork parent, until its
# stopped child runs).
STOP_WAITING_S = 0.5
# A thread's context switches in /proc/<pid>/task/<tid>/status: they move whenever it runs.
CONTEXT_SWITCHES = re.compile(rb"^(?:non)?voluntary_ctxt_switches:\s*(\d+)", re.MULTILINE)

# Variables a worker may inherit: locale, search paths and the knobs compilers and CUDA need.
ENV_ALLOW = frozenset(
    {
        "PATH",
        "LANG",
        "LC_ALL",
        "LC_CTYPE",
        "TZ",
        "LD_LIBRARY_PATH",
        "CC",
        "CXX",
        "CUDA_HOME",
        "CUDA_PATH",
        "CUDA_VISIBLE_DEVICES",
        "CUDA_DEVICE_ORDER",
        "NVIDIA_VISIBLE_DEVICES",
        "TORCH_CUDA_ARCH_LIST",
    }
)
ENV_ALLOW_PREFIXES = ("TORCH_", "CUDA_", "NVCC_", "TRITON_")
# Anything that looks like a credential is dropped even when a prefix allows it.
ENV_DENY_WORDS = ("KEY", "TOKEN", "SECRET", "PASSWORD", "PASSWD", "CREDENTIAL", "AUTH")
# Variables the sandbox sets itself; an inherited value would point outside the private directory.
ENV_OWN = frozenset({"TORCH_EXTENSIONS_DIR", "TRITON_CACHE_DIR", "TORCHINDUCTOR_CACHE_DIR"})
# glibc's malloc in every process of a job: blocks under MMAP_THRESHOLD_BYTES (the most glibc allows, where its own
# threshold stops growing) come from the heap, and what lies free at the heap's top (TRIM_THRESHOLD_BYTES: all) is
# kept rather than given back to the kernel (setting either stops glibc's own adjustment of both, hence both). By
# default the top was given back whenever more than twice the last freed large block lay free there, so whether a
# step's temporaries were faulted in afresh in every block (about 2.4 us a 4 KiB page) or reused resident pages
# depended on the process's heap history: the output digest of identical code took 5.2-5.6 ms a block in one worker
# (944 page faults each) against 3.0 ms in the other (none), either side the slower, and an honest C++ candidate was
# rejected for work moved into the digest. What the heap keeps is within the job's peak, which its memory limit
# allowed. Larger blocks stay mapped on their own here; a CPU worker's timing takes them from the heap too
# (keep_large_blocks_in_heap).
MMAP_THRESHOLD_BYTES = 32 << 20
TRIM_THRESHOLD_BYTES = 1 << 62
# glibc's mallopt parameter (malloc.h): how many blocks malloc may map on their own.
M_MMAP_MAX = -4


@dataclass(frozen=True)
class SandboxSpec:
    """Limits one worker runs under; serialised onto the worker's command line."""

    home: str
    strict: bool
    uid: int | None
    memory_bytes: int | None
    max_processes: int
    max_file_bytes: int
    # Directories the worker must still reach after /tmp and unreadable parents (e.g. /root) are hidden.
    keep_paths: tuple[str, ...] = ()
    # The job cgroup's `cgroup.procs` files (job_cgroup): the worker joins its group before anything else.
    cgroup_procs: tuple[str, ...] = ()
    # A CUDA worker, whose driver names its threads through /proc (landlock.restrict_self).
    cuda: bool = False
    # Where every worker's directory is made, this service's and any other's on the host under the same parent: in
    # process isolation (one uid for all) the job reads nothing beneath it but its home and `keep_paths`.
    jobs_parent: str | None = None

    def to_arg(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_arg(cls, text: str) -> SandboxSpec:
        fields = json.loads(text)
        return cls(
            **{
                **fields,
                "keep_paths": tuple(fields.get("keep_paths", ())),
                "cgroup_procs": tuple(fields.get("cgroup_procs", ())),
            }
        )


def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


def _check(result: int, what: str) -> None:
    if result != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def _allowed(name: str) -> bool:
    return (name in ENV_ALLOW or name.startswith(ENV_ALLOW_PREFIXES)) and not any(
        word in name.upper() for word in ENV_DENY_WORDS
    )


def tool_env(source: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of a program the service starts for itself (the removal of a job's directory, a start-up
    probe, the PCH build): the allow-list of the service's own, minus secrets, with its home and import path. Such
    a program is dumpable again once it has exec'd, whatever the service set for itself, so in `process` isolation
    any job of the service's uid can read its /proc/<pid>/environ (a red-team job took the service's API key from an
    `rm -rf` of another job's directory)."""
    source = dict(os.environ if source is None else source)
    env = {name: value for name, value in source.items() if _allowed(name)}
    env.setdefault("PATH", "/usr/local/bin:/usr/bin:/bin")
    env.update({name: source[name] for name in ("HOME", "PYTHONPATH") if name in source})
    return env


def child_env(home: Path, build_jobs: int, threads: int, source: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of a worker: an allow-list of the service's, minus secrets, plus private paths."""
    source = dict(os.environ if source is None else source)
    env = {name: value for name, value in source.items() if _allowed(name) and name not in ENV_OWN}
    env.setdefault("PATH", "/usr/local/bin:/usr/bin:/bin")
    env.update(
        {
            "HOME": str(home),
            "TMPDIR": str(home),
            "USER": "sandbox",
            "LOGNAME": "sandbox",
            "TORCH_EXTENSIONS_DIR": str(home / "torch_extensions"),
            "TRITON_CACHE_DIR": str(home / "triton"),
            "TORCHINDUCTOR_CACHE_DIR": str(home / "inductor"),
            "MAX_JOBS": str(build_jobs),
            "OMP_NUM_THREADS": str(threads),
            # OpenMP threads sleep between parallel regions rather than spin: a spinning thread burns CPU on the
            # judge's clock after a call returns (an honest candidate that set more threads in its forward was
            # `implausible_timing` in 10 of 14 runs, correct in 8 of 8 with this).
            "OMP_WAIT_POLICY": "PASSIVE",
            "MKL_NUM_THREADS": str(threads),
            "MALLOC_ARENA_MAX": "2",
            "MALLOC_MMAP_THRESHOLD_": str(MMAP_THRESHOLD_BYTES),
            "MALLOC_TRIM_THRESHOLD_": str(TRIM_THRESHOLD_BYTES),
            # torch's CPU allocator asks for transparent huge pages (madvise) for blocks of 2 MiB and more, where
            # the host allows it: with 4 KiB pages the same memory-bound step ran at its own speed in each process
            # (a 48 MiB refill 10-22 ms a block, by process, for identical code on a 2-core machine), which the
            # judge read as work moved out of the timed calls: the README's honest example was rejected in a CI
            # run, its digest and the rest of its blocks 17-31 % slower than the timer's in every round. With
            # huge pages the README example scored 1.13-1.25x with no flag in 8 of 8 runs (0.96-1.74x, 4 of 6
            # charged for its draws, without).
            "THP_MEM_ALLOC_ENABLE": "1",
            "PYTHONPATH": worker_python_path(source.get("PYTHONPATH", "")),
            "PYTHONDONTWRITEBYTECODE": "1",
            "PYTHONUNBUFFERED": "1",
        }
    )
    return env


def keep_large_blocks_in_heap() -> None:
    """From here on, blocks over MMAP_THRESHOLD_BYTES come from the heap too and stay there once freed: called as a
    CPU worker starts timing, on both sides. Mapped on their own, each was faulted in afresh at every use, and a
    candidate that told its own malloc not to map any (`mallopt(M_MMAP_MAX, 0)` at import, one line) had its 64 MiB
    outputs reuse resident pages where the reference's timer faulted in each one: `correct` at 1.5-3.0x for an
    unchanged `x + y`. Each setting a process may change is set to what costs least, so changing it buys nothing
    (for the same reason nothing at the heap's top is given back: a cap of 1 GiB there left outputs over 1 GiB
    faulted in afresh at every call but for a candidate that raised it).

    Only for timing: torch's blocks are aligned (posix_memalign), and glibc's heap often does not reuse the room
    freed aligned blocks left for the next ones. Set from a worker's start, the reference role's five trials of
    192 MiB inputs grew its address space by 0.4-0.6 GiB a trial, past a 2 GiB limit (a CI failure); a loop of three
    192 MiB blocks, allocated and freed, stayed at 0.6 GiB with malloc and reached 2.5 GiB with 64-byte alignment.
    A CUDA worker's timed calls allocate device memory, which this does not touch."""
    _libc().mallopt(M_MMAP_MAX, 0)


def _mount(libc: ctypes.CDLL, source: str | None, target: str, fstype: str | None, flags: int, data: str = "") -> None:
    encode = lambda text: text.encode() if text is not None else None  # noqa: E731
    _check(libc.mount(encode(source), encode(target), encode(fstype), flags, encode(data or None)), f"mount {target}")


def mount_job_disk(root: Path, size_mb: int) -> None:
    """A tmpfs of `size_mb` MiB over a worker's directory (an empty one of the service's, mode 0711): everything
    its job writes (its home, its output) counts against that size, never against the filesystem the other jobs
    and the service share. Pages are charged to the memory cgroup of whoever writes them. Its inodes are bounded
    too (JOB_DISK_INODES_PER_MB): the kernel frees them all at once when the disk goes. Named JOB_DISK_SOURCE, so
    that any worker can tell every such disk from the other mounts it sees. Needs CAP_SYS_ADMIN."""
    options = f"mode=0711,size={size_mb}m,nr_inodes={size_mb * JOB_DISK_INODES_PER_MB}"
    _mount(_libc(), JOB_DISK_SOURCE, str(root), "tmpfs", MS_NOSUID | MS_NODEV, options)


def disk_used_bytes(root: Path, device: int) -> int | None:
    """Bytes in use on a job's disk mounted at `root` (the pages its files hold); None where `root` is no longer on
    that disk (`device`, its st_dev) or gone."""
    try:
        descriptor = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        if os.fstat(descriptor).st_dev != device:
            return None
        info = os.fstatvfs(descriptor)
    finally:
        os.close(descriptor)
    return (info.f_blocks - info.f_bfree) * info.f_frsize


def disk_bytes(size: int) -> int:
    """What a file of `size` bytes takes on a tmpfs: whole pages."""
    return -(-size // PAGE_BYTES) * PAGE_BYTES


def detach_mounts(path: Path) -> None:
    """Detach every mount at or under `path` (resolved, as mountinfo has it: never through a link a job could
    plant) in the service's namespace, deepest first: a worker's disk when its job is over, or those a dead service
    left."""
    _detach(_libc(), [mount.point for mount in _mounts() if _under(mount.point, str(path))])


def _job_disks_seen() -> list[str]:
    """Mount points of every worker's disk (JOB_DISK_SOURCE) in the calling process's namespace, of any service."""
    return [mount.point for mount in _mounts() if mount.source == JOB_DISK_SOURCE]


def _detach(libc: ctypes.CDLL, points: list[str]) -> None:
    for point in sorted(points, key=len, reverse=True):
        libc.umount2(point.encode(), MNT_DETACH)  # one that is already gone is no loss


def _untraversable_ancestor(path: str) -> str | None:
    """Highest parent of `path` that other users cannot enter (e.g. /root holding a pyenv Python)."""
    for parent in reversed(Path(path).parents):
        if str(parent) != "/" and not os.stat(parent).st_mode & stat.S_IXOTH:
            return str(parent)
    return None


def _world_writable_dirs() -> tuple[str, ...]:
    """Real paths of the shared writable directories: PRIVATE_TMPFS, SHARED_WRITABLE and every sticky,
    world-writable directory one level below SCAN_WRITABLE_IN."""
    found = [*PRIVATE_TMPFS, *SHARED_WRITABLE]
    for parent in SCAN_WRITABLE_IN:
        with contextlib.suppress(OSError), os.scandir(parent) as entries:
            for entry in entries:
                with contextlib.suppress(OSError):
                    if (
                        entry.is_dir(follow_symlinks=False)
                        and entry.stat(follow_symlinks=False).st_mode & 0o1777 == 0o1777
                    ):
                        found.append(entry.path)
    real = (os.path.realpath(path) for path in found if os.path.isdir(path))
    return tuple(dict.fromkeys(path for path in real if path != "/"))


# Found once, when the service (and each worker) imports this module.
PRIVATE_DIRS = _world_writable_dirs()


def _private_mount(libc: ctypes.CDLL, directory: str) -> None:
    """An empty filesystem of the worker's own over a shared writable directory."""
    if directory == MQUEUE_DIR:
        # POSIX message queues of the worker's IPC namespace, not the host's.
        with contextlib.suppress(OSError):
            _mount(libc, "mqueue", directory, "mqueue", MS_NOSUID | MS_NODEV | MS_NOEXEC)
            return
    if directory in {os.path.realpath(d) for d in PRIVATE_TMPFS}:
        # Inodes bounded as a job disk's: without one, a job's empty files there (kernel memory no disk block or
        # resident page shows) were bounded only by the host's memory where the job has no cgroup.
        options = f"mode=1777,size={PRIVATE_TMPFS_MB}m,nr_inodes={PRIVATE_TMPFS_MB * JOB_DISK_INODES_PER_MB}"
        _mount(libc, "tmpfs", directory, "tmpfs", MS_NOSUID | MS_NODEV, options)
    else:
        _mount(libc, "tmpfs", directory, "tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC, "mode=1777,size=4m,nr_inodes=1024")


class Mount(NamedTuple):
    """One line of /proc/self/mountinfo: mount id, mount point (decoded), the flags of its per-mount options, and,
    after the optional fields' ` - ` separator, its filesystem type and source."""

    id: int
    point: str
    flags: int
    fstype: str
    source: str


def _mounts() -> list[Mount]:
    """Mounts of the calling process's namespace."""
    found = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        fields = line.split()
        flags = sum(MOUNT_OPTION_FLAGS.get(option, 0) for option in fields[5].split(","))
        after = line.partition(" - ")[2].split()
        fstype, source = (after[0] if after else ""), (after[1] if len(after) > 1 else "")
        found.append(Mount(int(fields[0]), _mount_point(fields[4]), flags, fstype, source))
    return found


def filesystem_type(path: Path) -> str:
    """The type of the filesystem `path` is on (`tmpfs`, `ext4`, ...), as this process's namespace mounts it."""
    mount_id = _mount_id_at(str(path))
    return next((mount.fstype for mount in _mounts() if mount.id == mount_id), "")


def _mount_point(field: str) -> str:
    """A mount point as /proc/self/mountinfo writes it, with its octal escapes (space, tab, newline, backslash)
    decoded."""
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


def _mount_id_at(path: str) -> int | None:
    """The id of the mount `path` resolves to now (None where nothing is there)."""
    try:
        descriptor = os.open(path, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    try:
        info = Path(f"/proc/self/fdinfo/{descriptor}").read_text()
    finally:
        os.close(descriptor)
    return int(re.search(r"^mnt_id:\s*(\d+)", info, re.MULTILINE).group(1))  # type: ignore[union-attr]


def _under(path: str, directory: str) -> bool:
    return path == directory or path.startswith(directory.rstrip("/") + "/")


def make_read_only(libc: ctypes.CDLL, writable: set[str]) -> None:
    """Remount every mount of the namespace read-only but those at `writable` (each its own mount) and /proc (the
    worker mounts its own there): nothing a job writes outside its home and its private scratch places reaches a
    later job or the service, whatever the permissions of a directory it can reach (a world-writable folder on
    the service's import path, in the cache volume, anywhere the scan for shared directories does not look)."""
    for mount_id, point, flags, _, _ in _mounts():
        if point in writable or _under(point, "/proc"):
            continue
        # A mount whose point now leads elsewhere lies under a tmpfs of ours, out of the job's reach (a work
        # directory that is a mount of its own under /tmp, a worker's disk): its path may exist again, as a plain
        # directory a bind-back made, where a remount fails. Any other failure fails the worker's start.
        if _mount_id_at(point) == mount_id:
            _mount(libc, None, point, None, MS_REMOUNT | MS_BIND | MS_RDONLY | flags)


def isolate_filesystem(keep: list[str], home: str) -> None:
    """Private mount namespace: empty tmpfs over world-writable dirs (PRIVATE_DIRS) and over unreadable parents
    of `keep`, then every `keep` directory bind-mounted back at its own path, and every mount read-only except
    `home` and the private directories. Runs as root, before the uid change."""
    libc = _libc()
    # Resolved now: once a tmpfs of ours covers a directory, a link on the way to the home (a work directory or
    # TMPDIR reached through one) no longer leads there.
    home = os.path.realpath(home)
    keep = sorted({os.path.realpath(p) for p in keep if os.path.isdir(p)}, key=len)
    private = {d for d in PRIVATE_DIRS if os.path.isdir(d)}
    hide = private | {a for p in keep if (a := _untraversable_ancestor(p))}
    hide = {d for d in hide if not any(d.startswith(o + "/") for o in hide)}
    covered = [p for p in keep if any(_under(p, d) for d in hide)]
    roots = [p for p in covered if not any(p.startswith(o + "/") for o in covered)]
    _check(libc.unshare(CLONE_NEWNS), "unshare(CLONE_NEWNS)")
    _mount(libc, None, "/", None, MS_REC | MS_PRIVATE)
    # The copies of other workers' disks (mount_job_disk, this service's or another's) this namespace got: their
    # jobs' logs would be in reach wherever no tmpfs of ours covers them, and their files would stay in memory for
    # as long as this worker lives.
    own_root = os.path.dirname(home)
    _detach(libc, [point for point in _job_disks_seen() if point != own_root])
    # Opened inside the new namespace (a bind source must belong to it), before the tmpfs hides them.
    fds = {p: os.open(p, os.O_PATH | os.O_DIRECTORY) for p in roots}
    for directory in sorted(hide, key=len):
        if directory in private:
            _private_mount(libc, directory)
        else:
            _mount(libc, "tmpfs", directory, "tmpfs", MS_NOSUID | MS_NODEV, "mode=755,size=1m")
    os.umask(0o022)
    for path, fd in fds.items():
        os.makedirs(path, exist_ok=True)
        _mount(libc, f"/proc/self/fd/{fd}", path, None, MS_BIND | MS_REC)
        os.close(fd)
    # The home becomes a mount of its own, so it stays writable when the mount holding it is made read-only.
    _mount(libc, home, home, None, MS_BIND)
    make_read_only(libc, private | {home})


def _exit_on_signal(signum: int, frame: object) -> None:
    os._exit(128 + signum)


def _die_like(status: int) -> None:
    """End the calling process the way a child with wait status `status` ended: same exit code or signal."""
    if not os.WIFSIGNALED(status):
        os._exit(os.waitstatus_to_exitcode(status) if os.WIFEXITED(status) else 1)
    signum = os.WTERMSIG(status)
    if signum != signal.SIGKILL:
        with contextlib.suppress(OSError, ValueError):
            signal.signal(signum, signal.SIG_DFL)
        with contextlib.suppress(OSError, ValueError):
            signal.pthread_sigmask(signal.SIG_UNBLOCK, [signum])
    os.kill(os.getpid(), signum)
    os._exit(128 + signum)  # a signal whose default action does not end the process


def _relay(child: int) -> None:
    """The part outside the pid namespace: wait for the worker, end as it ended.

    It reads nothing (stdin becomes /dev/null) but keeps its copy of every other descriptor the worker was
    started with, the events pipe included: the service sees that pipe end only once the relay is exiting, with
    its exit status already fixed, so a SIGKILL the service sends on seeing the end cannot replace the worker's
    own exit code or signal. The pipe to the child (the lifeline) stays open until the relay exits."""
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, signal.SIG_DFL)
    try:
        _, status = os.waitpid(child, 0)
    except ChildProcessError:
        os._exit(1)
    _die_like(status)


def enter_pid_namespace(libc: ctypes.CDLL) -> None:
    """Move the caller into new pid and IPC namespaces: fork, and return in the child (pid 1 there). The parent
    never returns: it relays the child's exit status (see the module docstring)."""
    # The relay dies with the service; root, so no later uid change clears it.
    _check(libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0), "prctl(PR_SET_PDEATHSIG)")
    _check(libc.unshare(CLONE_NEWPID | CLONE_NEWIPC), "unshare(CLONE_NEWPID | CLONE_NEWIPC)")
    lifeline, lifeline_end = os.pipe()
    child = os.fork()
    if child != 0:
        os.close(lifeline)
        _relay(child)
        os._exit(1)  # not reached
    os.close(lifeline_end)
    # Killed when the relay dies (set again after the uid change, which clears it); then the kernel kills every
    # process of the namespace. EOF on the lifeline: the relay died before this was set.
    _check(libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0), "prctl(PR_SET_PDEATHSIG)")
    if select.select([lifeline], [], [], 0)[0]:
        os._exit(1)
    os.close(lifeline)
    for signum in EXIT_SIGNALS:
        signal.signal(signum, _exit_on_signal)


def mount_proc(libc: ctypes.CDLL) -> None:
    """A procfs of the worker's own pid namespace on /proc (needs the private mount namespace)."""
    _mount(libc, "proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, "hidepid=2")


def limit_ipc() -> None:
    """Small System V IPC limits in the worker's own IPC namespace (as root, through its own /proc)."""
    for name, value in IPC_LIMITS.items():
        Path("/proc/sys", name).write_text(f"{value}\n")


def enter(spec: SandboxSpec) -> None:
    """Apply the sandbox to the calling process (the worker, before it reads any job).

    In strict isolation the process forks here: the caller stays outside as the relay and never returns; the
    worker goes on in the child (see the module docstring)."""
    for procs in spec.cgroup_procs:
        # First, as root: every process of the job is born in the group (the service checks it at `ready`).
        with open(procs, "w") as handle:
            handle.write(str(os.getpid()))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    resource.setrlimit(resource.RLIMIT_FSIZE, (spec.max_file_bytes, spec.max_file_bytes))
    resource.setrlimit(resource.RLIMIT_NOFILE, (MAX_OPEN_FILES, MAX_OPEN_FILES))
    if spec.memory_bytes is not None:
        resource.setrlimit(resource.RLIMIT_AS, (spec.memory_bytes, spec.memory_bytes))
    # The first to be killed when the host, or compose's container, runs out of memory, before the service (in
    # compose, whose container has no job cgroups, each job's limit times the jobs exceeds the container's). Set
    # with CAP_SYS_RESOURCE, it is also the lowest the job may set it back to; without (compose), the job may lower
    # it to the service's own.
    with open("/proc/self/oom_score_adj", "w") as handle:
        handle.write(f"{OOM_SCORE_ADJ}\n")
    libc = _libc()
    reachable = [spec.home, *spec.keep_paths, sys.prefix, sys.base_prefix, sys.exec_prefix]
    reachable += [p for p in sys.path if p and os.path.isabs(p)]
    if spec.strict:
        assert spec.uid is not None
        enter_pid_namespace(libc)
        isolate_filesystem(reachable, spec.home)
        mount_proc(libc)
        limit_ipc()
        _check(libc.unshare(CLONE_NEWNET), "unshare(CLONE_NEWNET)")
        # Counts the processes of the uid, this one (pid 1 of the namespace) included.
        resource.setrlimit(resource.RLIMIT_NPROC, (spec.max_processes, spec.max_processes))
        os.setgroups([])
        os.setgid(spec.uid)
        os.setuid(spec.uid)
    os.umask(0o077)
    _check(libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "prctl(PR_SET_NO_NEW_PRIVS)")
    # Before the seccomp filter, whose rules need not know Landlock's calls. In process isolation the job's uid owns
    # other jobs' files and the build cache, so there it changes files only in its home (and writes devices), and
    # reads no other job's; in strict isolation the mounts and uids do that already, and leave the private
    # directories (PRIVATE_DIRS) writable.
    if spec.strict:
        landlock.restrict_self(names_threads=spec.cuda)
    else:
        landlock.restrict_self(
            home=spec.home, names_threads=spec.cuda, unreadable=spec.jobs_parent, readable=tuple(reachable)
        )
    if not spec.strict:
        # The job's orphans stay in its worker's process tree, which the judge stops during the reference's turns
        # and kills after the job (strict isolation's go to pid 1 of its namespace). The filter then keeps the job
        # from clearing this, and from putting a process directly under the service (CLONE_PARENT).
        adopt_orphans()
    syscall_filter.install(own_namespaces=spec.strict)
    # Set after the uid change, which clears it: the worker dies with the service.
    _check(libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0), "prctl(PR_SET_PDEATHSIG)")
    # Not dumpable: no process of another job, even under this uid (process isolation), can open this worker's
    # /proc/<pid>/fd (its command and event pipes), read or write its memory, or trace it. A red-team job in
    # process isolation read an idle worker's command pipe, rewrote the job line that made it the reference's
    # timer, and scored zeros `correct` at 36x. A worker that becomes a candidate turns it back on (judge_may_read).
    _check(libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0), "prctl(PR_SET_DUMPABLE)")
    os.chdir(spec.home)


def judge_may_read() -> None:
    """Make the candidate's worker dumpable again, before candidate code runs: in process isolation the service,
    under the same uid, reads a checked CPU output from the stopped worker's memory (held_memory), which needs it.
    Other jobs under that uid can then reach the candidate too, never the reference's workers."""
    _check(_libc().prctl(PR_SET_DUMPABLE, 1, 0, 0, 0), "prctl(PR_SET_DUMPABLE)")


def probe_main() -> None:
    """Child side of `strict_isolation_works`: exit 0 if, after `enter`, the interpreter can still import and the
    process is pid 1 of its own pid namespace with its own /proc and its own, limited IPC namespace."""
    home, uid = sys.argv[2], int(sys.argv[3])
    enter(SandboxSpec(home=home, strict=True, uid=uid, memory_bytes=None, max_processes=64, max_file_bytes=1 << 20))
    import fractions  # noqa: F401 - a stdlib module not imported yet: proves the interpreter is still readable

    pids = sorted(int(name) for name in os.listdir("/proc") if name.isdigit())
    checks = {
        "uid": os.getuid() == uid,
        "interpreter readable": os.access(sys.base_prefix, os.R_OK | os.X_OK),
        "pid 1": os.getpid() == 1,
        f"own /proc (sees pids {pids[:10]})": pids == [1],
        "shmmax": Path("/proc/sys/kernel/shmmax").read_text().strip() == str(SHM_BYTES),
        "read-only outside its home": bool(os.statvfs(sys.base_prefix).f_flag & os.ST_RDONLY)
        and not os.statvfs(home).f_flag & os.ST_RDONLY,
    }
    failed = [name for name, ok in checks.items() if not ok]
    if failed:
        sys.stderr.write(f"strict isolation probe failed: {', '.join(failed)}\n")
    sys.exit(1 if failed else 0)


def writable_by_others(path: str) -> bool:
    """Whether a user other than its owner (a job's uid) could put a file at `path`: it does not exist yet (whoever
    creates it decides), it is world-writable, or a parent of it (as written or resolved) is world-writable without
    the sticky bit (the folder itself can then be replaced)."""
    try:
        if os.stat(path).st_mode & stat.S_IWOTH:
            return True
        parents = {*Path(path).parents, *Path(path).resolve().parents}
        return any((mode := os.stat(parent).st_mode) & stat.S_IWOTH and not mode & stat.S_ISVTX for parent in parents)
    except OSError:
        return True


_warned_python_path: set[str] = set()


def worker_python_path(service_python_path: str) -> str:
    """The project, then the service's own PYTHONPATH: a package installed beside the service that way (tree-sitter,
    which split builds parse with) must import in its workers too, or every split build quietly builds whole.

    An entry other users can write to is left out: a worker starts as root and runs the `sitecustomize.py` of its
    import path before the sandbox, so whoever could write there would run code as root in every later worker.
    (Inside the sandbox every folder a job reaches but its home is read-only: see make_read_only.)"""
    own = []
    for entry in service_python_path.split(os.pathsep):
        if not os.path.isabs(entry):
            continue
        if writable_by_others(entry):
            if entry not in _warned_python_path:
                _warned_python_path.add(entry)
                log.warning(
                    "%s is on PYTHONPATH but does not exist or other users can write to it: workers do not import "
                    "from it",
                    entry,
                )
            continue
        own.append(entry)
    return os.pathsep.join(dict.fromkeys([str(Path(__file__).resolve().parents[2]), *own]))


def strict_isolation_works(uid: int) -> bool:
    """Strict isolation needs root (uid change, namespaces); try it in a throwaway child."""
    if os.geteuid() != 0:
        return False
    code = "from services.evaluator.sandbox import probe_main; probe_main()"
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    with tempfile.TemporaryDirectory(prefix="kernel-agent-probe-") as home:
        try:
            os.chown(home, uid, uid)  # root without CAP_CHOWN (a container with its capabilities dropped) fails here
            done = subprocess.run(
                [sys.executable, "-P", "-c", code, "probe", home, str(uid)],
                env=env,
                cwd="/",
                capture_output=True,
                timeout=60,
                check=False,
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            log.warning("strict isolation does not work here: %s", exc)
            return False
    if done.returncode != 0:
        log.warning("strict isolation does not work here: %s", done.stderr.decode(errors="replace")[-1000:])
    return done.returncode == 0


# The extended attributes that hold a directory's POSIX ACLs.
ACL_ATTRIBUTES = ("system.posix_acl_access", "system.posix_acl_default")


def set_plain_mode(path: Path | str, mode: int) -> None:
    """Give a directory the service made exactly `mode`, with no ACL: in `process` isolation a job, under the
    service's uid, can put a default ACL on a directory the service creates in (a red-team job gave the work
    directory one with no rights for the owner, and every worker the service made after it failed to start)."""
    for name in ACL_ATTRIBUTES:
        with contextlib.suppress(OSError):  # none set, or a filesystem without ACLs
            os.removexattr(path, name)
    os.chmod(path, mode)


def has_acl(path: Path) -> bool:
    try:
        names = os.listxattr(path, follow_symlinks=False)
    except OSError:
        return False  # a filesystem without extended attributes
    return any(name in ACL_ATTRIBUTES for name in names)


def make_dir(path: Path, mode: int) -> Path:
    """Create `path` with exactly `mode` and no ACL, whatever its parent's default ACL (set_plain_mode)."""
    path.mkdir(mode=mode)
    set_plain_mode(path, mode)
    return path


def make_private_dir(path: Path, uid: int | None) -> Path:
    """Create `path` (mode 0700, make_dir) owned by the sandbox uid, inside a root-owned parent it cannot replace."""
    make_dir(path, 0o700)
    if uid is not None:
        os.chown(path, uid, uid)
    return path


def read_regular_file(path: Path, max_bytes: int) -> bytes:
    """Read a file a worker wrote, refusing symlinks, non-regular files and oversized files."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise ValueError(f"{path.name} is not a regular file")
        if info.st_size > max_bytes:
            raise ValueError(f"{path.name} is larger than {max_bytes} bytes")
        with os.fdopen(os.dup(fd), "rb") as handle:
            return handle.read(max_bytes + 1)[:max_bytes]
    finally:
        os.close(fd)


def write_readonly_file(path: Path, data: bytes) -> None:
    """Write a root-owned file a worker may read but not change."""
    path.write_bytes(data)
    os.chmod(path, 0o444)


def process_table() -> dict[int, tuple[int, set[int]]]:
    """Every process of the host: pid -> (parent pid, its real and saved uids), from one read of each
    /proc/<pid>/status. The judge scans several times per timed block, and with 16 evaluations on a GPU host these
    scans were most of what the service ran: plain os reads and a search for the two fields, no file objects, no
    split into lines, no psutil (which reads two files per process and builds an object for each)."""
    table: dict[int, tuple[int, set[int]]] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            handle = os.open(f"/proc/{name}/status", os.O_RDONLY)
            try:
                status = os.read(handle, STATUS_HEAD_BYTES)
            finally:
                os.close(handle)
        except OSError:
            continue  # exited meanwhile
        # The name, the only field a process sets, comes first, escaped: it cannot hold a line of its own.
        ppid_at, uid_at = status.find(b"\nPPid:"), status.find(b"\nUid:")
        if ppid_at < 0 or uid_at < 0:
            continue
        # Real, effective, saved, filesystem. Not the effective uid: the uid signaller takes a job's for each
        # request (real and saved uids no job holds), and a kill scan for that job that ran meanwhile in another
        # thread (a memory watch's kill beside the evaluation's own) killed the signaller, so that every later
        # evaluation ended evaluator_error. Real or saved is also who the kernel lets a job's processes signal.
        uids = status[uid_at + 5 : status.find(b"\n", uid_at + 1)].split()
        table[int(name)] = (int(status[ppid_at + 6 : status.find(b"\n", ppid_at + 1)]), {int(uids[0]), int(uids[2])})
    return table


def job_pids(uid: int | None, root_pids: list[int], table: dict[int, tuple[int, set[int]]] | None = None) -> list[int]:
    """Pids of a worker's job: the roots that are alive, their descendants, and in strict isolation every process
    whose real or saved uid is the job's (one scan of /proc, or `table` where the caller has one)."""
    table = process_table() if table is None else table
    children: dict[int, list[int]] = {}
    for pid, (ppid, _) in table.items():
        children.setdefault(ppid, []).append(pid)
    found = [pid for pid in root_pids if pid in table]
    seen = set(found)
    for pid in found:  # grows while it is walked: every descendant
        for child in children.get(pid, ()):
            if child not in seen:
                seen.add(child)
                found.append(child)
    if uid is not None:
        found += [pid for pid, (_, uids) in table.items() if uid in uids and pid not in seen]
    return [pid for pid in found if pid != os.getpid()]


def processes_of(uid: int | None, root_pids: list[int]) -> list[psutil.Process]:
    import psutil  # service side only; workers never import it

    found = []
    for pid in job_pids(uid, root_pids):
        with contextlib.suppress(psutil.Error):
            found.append(psutil.Process(pid))
    return found


class UnstoppableJobError(RuntimeError):
    """A job's processes did not all come to a stop within STOP_SETTLE_S."""


class ThreadMark(NamedTuple):
    """What /proc says of one thread of a job: its state letter, whether it is exiting, its context switches so
    far (voluntary, involuntary), which move whenever it runs, the CPU ticks of the children its process has
    waited for (cutime + cstime, the same for every thread of a process), which move whenever it reaps one, and
    whether its process has a controlling terminal."""

    state: bytes
    exiting: bool
    switches: tuple[int, ...]
    reaped_ticks: int = 0
    has_terminal: bool = False


class JobStop(NamedTuple):
    """A job stopped by stop_job: the pids it signalled, and each thread's mark (by thread id) once it held still."""

    pids: list[int]
    marks: dict[int, ThreadMark]


def _thread_marks(pids: list[int]) -> tuple[dict[int, ThreadMark], set[int]]:
    """Each thread's mark (by thread id) of the processes `pids` that are still there, and their children that are
    not among `pids`."""
    known = set(pids)
    marks: dict[int, ThreadMark] = {}
    outside: set[int] = set()
    for pid in pids:
        try:
            tids = os.listdir(f"/proc/{pid}/task")
        except OSError:
            continue  # gone
        for tid in tids:
            task = f"/proc/{pid}/task/{tid}"
            try:
                with open(f"{task}/stat", "rb") as handle:
                    # After the command name: state, ppid, pgrp, session, tty_nr, tpgid, flags, ...
                    fields = handle.read().rsplit(b")", 1)[1].split()
                with open(f"{task}/status", "rb") as handle:
                    switches = tuple(int(count) for count in CONTEXT_SWITCHES.findall(handle.read()))
                with open(f"{task}/children", "rb") as handle:
                    outside |= {int(child) for child in handle.read().split()} - known
            except (OSError, IndexError):
                continue  # exited meanwhile
            reaped_ticks = int(fields[13]) + int(fields[14])  # cutime, cstime
            exiting, has_terminal = bool(int(fields[6]) & PF_EXITING), fields[4] != b"0"  # flags, tty_nr
            marks[int(tid)] = ThreadMark(fields[0], exiting, switches, reaped_ticks, has_terminal)
    return marks, outside


def _stop_marks(pids: list[int], waiting_settled: bool) -> dict[int, ThreadMark] | None:
    """Whether the job holds still: every thread of `pids` settled (stopped, a zombie, gone, or where
    `waiting_settled`, waiting in the kernel: STOP_WAITING_S) and none with a child outside `pids` or still able
    to resume (_may_resume). Then each thread's mark; else None."""
    settled = b"ZXTtD" if waiting_settled else b"ZXTt"
    marks, outside = _thread_marks(pids)
    if outside or any(m.state not in settled or _may_resume(m) for m in marks.values()):
        return None
    return marks


def ran_since_stop(stop: JobStop) -> str:
    """What shows that the job of `stop` ran since ("" if nothing): a thread read as stopped then that has switched
    since or is gone (a thread that had exited may be gone), or a child of its processes that was not there: a
    stopped process cannot fork. A thread then in the kernel (state D: STOP_WAITING_S) may end its wait and stop,
    which switches it, and nothing else (it has STOP_SETTLE_S to get there): a SIGCONT before its wait ends undoes
    the stop still pending for it, and it runs on once the wait ends (a red-team helper in a long write escaped so,
    by its own timers, before syscall_filter refused them).
    Its CPU clock tells what it did in the kernel, and its process's reaped ticks whether it started a child and
    waited for it (a red-team helper's child ran 60 ms so in `process` isolation, where no clock of the judge's keeps
    an exited child's time)."""
    deadline = time.monotonic() + STOP_SETTLE_S
    while True:
        marks, outside = _thread_marks(stop.pids)
        if outside:
            return f"started processes {sorted(outside)[:5]}"
        # A thread whose wait ended after the stop runs in the kernel on its way to stopping (the rest of a munmap
        # that waited for the address space's lock): it is let finish (a CI run's check read one so, runnable, as
        # one that ran while held). Its CPU clock, read after, tells what it did.
        finishing = [tid for tid, mark in stop.marks.items() if mark.state == b"D" and _state(marks.get(tid)) == "R"]
        if not finishing:
            break
        if time.monotonic() > deadline:
            return f"threads {finishing[:5]} ran on after their wait in the kernel ended"
        time.sleep(0.001)
    _off_cpu(tid for tid, mark in stop.marks.items() if mark.state == b"D")  # its last tick is clocked as it leaves
    moved = [tid for tid, mark in stop.marks.items() if not _stayed_stopped(mark, marks.get(tid))]
    if moved:
        changes = "; ".join(f"{tid} {_change(stop.marks[tid], marks.get(tid))}" for tid in moved[:5])
        return f"threads {moved[:5]} ran or exited ({changes})"
    return ""


def _change(at_stop: ThreadMark, now: ThreadMark | None) -> str:
    """A thread's state at the stop and now (`gone`: exited and released), and each other part of its mark that
    changed, to tell what happened: an honest candidate was once flagged with a thread stopped at both reads
    (T>T) and which part had moved was not recorded."""
    parts = [f"{at_stop.state.decode()}>{_state(now)}"]
    if now is not None:
        parts += [
            f"{name} {before}>{after}"
            for name, before, after in zip(ThreadMark._fields[1:], at_stop[1:], now[1:], strict=True)
            if before != after
        ]
    return " ".join(parts)


def _state(mark: ThreadMark | None) -> str:
    return "gone" if mark is None else mark.state.decode()


def _stayed_stopped(at_stop: ThreadMark, now: ThreadMark | None) -> bool:
    if at_stop.state == b"D":
        return now is not None and now.state in b"DT" and now.reaped_ticks == at_stop.reaped_ticks
    if at_stop.state in b"ZX":  # a thread that had exited: the kernel releases it, whenever it does
        return now is None or now == at_stop
    return now == at_stop


def _may_resume(mark: ThreadMark) -> bool:
    """Whether a thread read as stopped or waiting in the kernel can still be resumed by the kernel, with none of
    the job's processes running. An exiting thread cannot be stopped, and its exit can resume others: the kernel
    sends SIGHUP and SIGCONT to a process group that the exit leaves orphaned with stopped members. A terminal's
    hangup sends them to the processes it controls, and a thread in the kernel can cause one as its call ends: a
    red-team helper, a session leader with a pseudo-terminal, waited in a `sendfile` to a socket that held the last
    reference to the terminal's master; the call's end released it, the hangup undid the stop pending for the
    helper, which ran while its job was held, unflagged, about 90 times an evaluation. A stopped thread of such a
    process is caught by the check if resumed (it switches); one in the kernel may switch, so it never counts as
    settled: the stop waits for it."""
    return (mark.state in b"TtD" and mark.exiting) or (mark.state == b"D" and mark.has_terminal)


def stop_job(uid: int | None, root_pid: int, signaller: UidSignaller | None = None) -> JobStop:
    """SIGSTOP every process of a worker's job; returns once the job holds still (`_stop_marks`) in two reads in a
    row with every thread off its CPU between them (_off_cpu) and none run, sending it again while it does not:
    processes of the job that were still running while the stop went round can resume those already stopped (an
    exit that orphans a stopped process group; kill(-1, SIGCONT) in a loop, where no seccomp filter refuses it).
    One read is no instant: a process read as stopped can be resumed by one read later, stopped by then (a CI run
    of test_uid_signals.py saw a stop return with the job running, 1 in 300). Two reads with no switch between saw
    every thread stopped at once, at the end of the first, and nothing stopped resumes anything. A job not settled
    within STOP_SETTLE_S raises UnstoppableJobError."""
    started = time.monotonic()
    deadline = started + STOP_SETTLE_S
    while True:
        pids = signal_once(uid, root_pid, signal.SIGSTOP, signaller)
        for pause_s in (0.0, 0.0005, 0.002, 0.005):  # threads that were running take a moment to stop
            time.sleep(pause_s)
            waiting_settled = time.monotonic() - started > STOP_WAITING_S
            marks = _stop_marks(pids, waiting_settled)
            # Off their CPUs before the second read: a thread switches out after it reads as stopped, and that
            # switch moves its count (a CI run's check took a thread so read for one that ran while held).
            if marks is not None and _off_cpu(marks) and _stop_marks(pids, waiting_settled) == marks:
                return JobStop(pids, marks)
        if time.monotonic() > deadline:
            raise UnstoppableJobError(f"the job's processes did not all stop within {STOP_SETTLE_S:g} s")


def _off_cpu(tids: Iterable[int]) -> bool:
    """Wait until every thread read as stopped has left its CPU; False if one runs again meanwhile. A thread shows
    as stopped from the moment its state is set, before it switches out; what it ran since the last scheduler tick
    is added to its process's and its cgroup's CPU clocks only at that switch (a clock read of another process does
    not add it), so a clock read in between misses up to a tick and a later read looks as if the job ran while
    stopped. Reading a thread's /proc `syscall` file waits in the kernel until the thread is off its CPU in the
    state it was in (wait_task_inactive), and says `running` if its state changed."""
    for tid in tids:
        try:
            with open(f"/proc/{tid}/syscall", "rb") as handle:
                if handle.read().startswith(b"running"):
                    return False
        except OSError:
            continue  # gone meanwhile, or a thread whose file the service may not read: its clock is as before
    return True


def signal_once(uid: int | None, root_pid: int, signum: int, signaller: UidSignaller | None = None) -> list[int]:
    """Send `signum` to every process of a worker's job once; the pids found and signalled (a stop that holds:
    stop_job). In strict isolation the signaller reaches every process of the uid at once first, so a job that keeps
    forking new pids cannot outrun the scan of /proc that follows; that scan then finds every process (stopped ones
    cannot fork) for the caller's clocks. Without it (process isolation) the scan alone: its process group, its
    process tree."""
    if signaller is not None and uid is not None:
        signaller.signal(uid, signum)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(root_pid, signum)
    pids = []
    for pid in job_pids(uid, [root_pid]):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signum)
            pids.append(pid)
    return pids


def kill_all(uid: int | None, root_pid: int, signaller: UidSignaller | None = None, rounds: int = 50) -> None:
    """SIGKILL the worker's process group and every process it left, by uid in strict isolation.

    Repeated because without a signaller a fork loop can create processes while we kill; the uid's RLIMIT_NPROC
    bounds it.
    """
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(root_pid, signal.SIGKILL)
    for _ in range(rounds):
        if signaller is not None and uid is not None:
            signaller.signal(uid, signal.SIGKILL)
        procs = processes_of(uid, [root_pid])
        procs = [proc for proc in procs if _alive(proc)]
        if not procs:
            return
        for proc in procs:
            with contextlib.suppress(Exception):
                proc.kill()
        time.sleep(0.02)


def adopt_orphans() -> None:
    """Make the calling process (the service, or a `process`-isolation worker) the child subreaper of every process
    it starts: a descendant whose parent exits is re-parented to it rather than to init (in the service, where
    kill_escaped finds it)."""
    _check(_libc().prctl(syscall_filter.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0), "prctl(PR_SET_CHILD_SUBREAPER)")


def kill_escaped(workers: set[int], wait_s: float = 0.0) -> list[int]:
    """Kill every child of this process that runs under more seccomp filters than it does but is none of `workers`,
    with all its descendants, and reap it, waiting up to `wait_s` for it to exit: a job's process re-parented here
    (adopt_orphans), since only job processes carry the workers' filter, which they cannot remove (zombies keep
    it). In `process` isolation such a process left its worker's tree, which the judge's stops and the kill after a
    job follow, when its worker exited before it (a worker keeps its job's other orphans: enter); before workers
    did, a red-team daemon so outlived its job, holding 60,000 open files. In `strict` isolation it is pid 1 of a
    namespace whose relay died first. Nothing else reaps these children, so their pids cannot be reused before
    this does. Returns the pids killed."""
    own = _seccomp_filters("self")
    escaped = [pid for pid in _children_of_self() - workers if _seccomp_filters(str(pid)) > own]
    killed = _stop_trees(escaped) if escaped else []
    for pid in killed:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + wait_s
    while True:
        for pid in list(escaped):
            try:
                # A zombie from an earlier call, or this one's if it died already.
                if os.waitpid(pid, os.WNOHANG)[0] == 0:
                    continue
            except ChildProcessError:
                pass
            escaped.remove(pid)
        if not escaped or time.monotonic() >= deadline:
            return killed
        time.sleep(0.01)


def _stop_trees(roots: list[int], rounds: int = 50) -> list[int]:
    """SIGSTOP `roots` and every descendant, scanning again until a scan finds none not stopped: a stopped process
    neither forks nor sees its parent die, so none escapes to be re-parented before the SIGKILL. Killed one by one
    instead, a red-team relay outran the sweep: each time its parent was killed, the child (polling getppid) forked
    the next generation, and it outlived its job and the service."""
    stopped: dict[int, None] = {}  # in the order stopped
    for _ in range(rounds):
        new = [pid for pid in job_pids(None, roots) if pid not in stopped]
        if not new:
            break
        for pid in new:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGSTOP)
            stopped[pid] = None
    return list(stopped)


def _children_of_self() -> set[int]:
    children: set[int] = set()
    for task in os.listdir("/proc/self/task"):
        with contextlib.suppress(OSError):
            children.update(int(pid) for pid in Path(f"/proc/self/task/{task}/children").read_text().split())
    return children


def _seccomp_filters(pid: str) -> int:
    """How many seccomp filters the process runs under (Linux 5.9 and later), 0 where it is gone or unknown."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return 0
    match = re.search(r"^Seccomp_filters:\s*(\d+)", status, re.MULTILINE)
    return int(match.group(1)) if match else 0


def resident_bytes(uid: int | None, root_pid: int, table: dict[int, tuple[int, set[int]]] | None = None) -> int:
    """Resident memory of a job: its worker, the worker's children and, in strict isolation, its uid's processes
    (`table`: a process_table the caller has already read)."""
    return sum(_resident_pages(pid) for pid in job_pids(uid, [root_pid], table)) * PAGE_BYTES


def _resident_pages(pid: int) -> int:
    """A process's resident pages. /proc/<pid>/statm reads them through the main thread: one that ended alone (the
    exit syscall, not exit_group) while other threads hold the memory shows none there, so a process that shows
    none is read through its other threads (one address space: the first that shows any)."""
    pages = _statm_resident(f"/proc/{pid}/statm")
    if pages:
        return pages
    with contextlib.suppress(OSError):
        for tid in os.listdir(f"/proc/{pid}/task"):
            pages = _statm_resident(f"/proc/{pid}/task/{tid}/statm")
            if pages:
                return pages
    return 0


def _statm_resident(path: str) -> int:
    try:
        with open(path, "rb") as handle:
            return int(handle.read().split()[1])
    except (OSError, ValueError, IndexError):
        return 0  # exited meanwhile


def _alive(proc: psutil.Process) -> bool:
    import psutil

    try:
        return proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


class UidSignaller:
    """Signals every process of one job uid at once (strict isolation), through a root helper process
    (uid_signaller.py says how and why). One per service; thread-safe: one request at a time."""

    def __init__(self, sender_uid: int) -> None:
        self._lock = threading.Lock()
        # -I -S: the helper imports nothing from the service's paths, which jobs might have been able to write.
        self._proc = subprocess.Popen(
            [sys.executable, "-I", "-S", str(Path(__file__).with_name("uid_signaller.py")), str(sender_uid)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            close_fds=True,
            env=tool_env(),
            # Out of the service's process group: a Ctrl-C or a group-wide SIGTERM that stops the service must not
            # end the helper first, while evaluations still stop and kill their jobs through it (each then ended
            # evaluator_error with a traceback). It exits at EOF, whenever the service is gone.
            start_new_session=True,
        )

    def signal(self, uid: int, signum: int) -> None:
        """Send `signum` to every process whose real uid is `uid`; returns once it is sent."""
        assert self._proc.stdin is not None and self._proc.stdout is not None
        with self._lock:
            try:
                self._proc.stdin.write(f"{int(signum)} {uid}\n".encode())
                self._proc.stdin.flush()
                answer = self._proc.stdout.readline()
            except OSError:
                answer = b""
        if answer != b"ok\n":
            raise RuntimeError(f"the uid signaller failed (exit status {self._proc.poll()}): {answer[:200]!r}")

    def close(self) -> None:
        if self._proc.stdin is not None:
            with contextlib.suppress(OSError):
                self._proc.stdin.close()
        try:
            self._proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()


class UidPool:
    """Unprivileged uids leased one per worker, so killing "every process of this uid" hits one job only. The uid
    just past the range is no job's: the signaller sends from it."""

    def __init__(self, base: int, size: int) -> None:
        self._free = list(range(base, base + size))
        self.signaller_uid = base + size

    def lease(self) -> int:
        if not self._free:
            raise RuntimeError("no free sandbox uid")
        return self._free.pop(0)

    def release(self, uid: int) -> None:
        self._free.append(uid)
