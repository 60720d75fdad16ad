"""A Landlock domain every worker enters in sandbox.enter(), before it reads a job: the kernel then keeps the job's
processes away from every process outside that domain, whatever their uid, and in `process` isolation from
changing files outside the job's home.

Landlock (Linux 5.13 and later) needs no privilege. A domain is inherited by every child and cannot be left. What
it scopes, and why it is here:
- ptrace access (every ABI): a process in a domain can trace, read or write the memory of (`/proc/<pid>/mem`), or
  open the descriptors of (`/proc/<pid>/fd`) only processes in its own domain or one nested in it. Workers are not
  dumpable, which keeps other processes of their uid out, but a worker the pool has just started is dumpable until
  it reaches sandbox.enter, and the kernel checks only when a file is opened: in `process` isolation (one uid for
  the service and every job) a red-team job that watched `/proc` opened a starting worker's memory for reading and
  writing, kept the descriptor after the worker turned non-dumpable, and so held any worker that later became a
  reference run or the reference's timer. Each worker's own domain shuts that window.
- signals (ABI 6, Linux 6.12): only to processes of its own domain: no job stops, interrupts or kills the service,
  another job's workers or an idle worker (in `process` isolation, red-team jobs killed the reference's timer and
  stopped it during the reference's turns).
- abstract unix sockets (ABI 6): only to ones bound in its own domain (in `process` isolation jobs share a network
  namespace, so two jobs could otherwise talk through one).
- TCP (ABI 4, Linux 6.7): no bind and no connect. In `strict` isolation a job's network namespace has no interface
  up, so nothing changes there; in `process` isolation a red-team job called its own service's HTTP API on
  127.0.0.1 (no token is needed on loopback), and any other evaluator's on the host. The rules check TCP's `bind`
  and `connect` alone: MPTCP, a TCP Fast Open send (which connects without `connect`) and a port `listen` chose
  without `bind` reached the API or another job all the same, so there the seccomp filter refuses every inet socket.
- writes (`process` isolation only): files and directories are made, written, truncated, removed, renamed or linked
  only beneath the job's home; beneath `/dev` what exists (devices) may be written, nothing made, and a CUDA worker's
  own threads' files in `/proc/self/task` (the CUDA driver names its threads there). There the service,
  the build cache, other jobs' directories and perhaps the service's own installation belong to the job's uid:
  red-team jobs rewrote every library in the build cache and planted files where another worker's inputs go. A file
  made in `/dev/shm` would outlive the job (a red-team job left 300 MiB there that no limit counted, and later jobs
  read it), so POSIX shared memory and semaphores (multiprocessing's locks) fail; POSIX message queues, made by a
  call of their own, are the seccomp filter's to refuse (syscall_filter). No socket file is made, even in the home:
  another job could connect to it by its path (Landlock scopes abstract sockets alone).
- reads (`process` isolation only): nothing is read, listed or run beneath the directory every worker's directory
  is made in (this service's and any other's there), but beneath the job's home and the paths it needs there (the
  build cache, the interpreter, the repository). Other jobs' homes are of its uid, and each was a channel between
  candidates evaluated at once (a red-team job had another compute 842 of its timed calls through a socket bound in
  its home: `correct`, no flag), and their logs were readable. Landlock grants by path beneath, so everything else
  is granted entry by entry beside each directory on the way down to it: those directories themselves cannot be
  listed, and what is made beside them after the worker starts cannot be read.
In `strict` isolation the mounts already keep everything outside the home and the private directories read-only,
other jobs' homes are other uids', and the domain handles no filesystem access there. A domain that handles any
filesystem access also refuses every rename or link into another directory (EXDEV) unless a rule grants that
(`REFER`), and caches and builds write files aside and move them into place: the rules beneath the home grant it.
Without write rules, the domain handles scopes and TCP alone from ABI 6; before it (ABI 2 to 5) it handles `REFER`
too (a domain must handle something before ABI 4) and grants it beneath `/`. ABI 1 has no `REFER`, and there, as
without Landlock (an older kernel, or one booted without it), workers get no domain: `/health` says so
(`details.landlock_abi` 0).
"""

from __future__ import annotations

import ctypes
import errno
import functools
import os
import platform
from pathlib import Path

# landlock_create_ruleset, landlock_add_rule, landlock_restrict_self: the same numbers on both machines.
CREATE_RULESET, ADD_RULE, RESTRICT_SELF = 444, 445, 446
CREATE_RULESET_VERSION = 1 << 0
RULE_PATH_BENEATH = 1
# Every filesystem access that changes something (ABI 1's, then REFER of ABI 2 and TRUNCATE of ABI 3); reading,
# listing and executing, handled in `process` isolation alone; device ioctls stay unhandled (ABI 5: CUDA's are how a
# job uses its GPU).
ACCESS_FS_EXECUTE, ACCESS_FS_WRITE_FILE, ACCESS_FS_READ_FILE, ACCESS_FS_READ_DIR = 1 << 0, 1 << 1, 1 << 2, 1 << 3
ACCESS_FS_CHANGES = ACCESS_FS_WRITE_FILE | sum(1 << bit for bit in range(4, 13))  # remove, make (dirs, files, nodes)
ACCESS_FS_MAKE_SOCK = 1 << 9
ACCESS_FS_READS = ACCESS_FS_EXECUTE | ACCESS_FS_READ_FILE | ACCESS_FS_READ_DIR
ACCESS_FS_FILE_READS = ACCESS_FS_EXECUTE | ACCESS_FS_READ_FILE  # what a rule on a file (not a directory) may grant
ACCESS_FS_REFER = 1 << 13
ACCESS_FS_TRUNCATE = 1 << 14
ACCESS_NET_BIND_TCP, ACCESS_NET_CONNECT_TCP = 1 << 0, 1 << 1
SCOPE_ABSTRACT_UNIX_SOCKET = 1 << 0
SCOPE_SIGNAL = 1 << 1
# The first ABI with REFER, with TRUNCATE, with TCP, and with scopes (signals, abstract unix sockets).
REFER_ABI, TRUNCATE_ABI, TCP_ABI, SCOPES_ABI = 2, 3, 4, 6
MACHINES = ("x86_64", "aarch64")


class _RulesetAttr(ctypes.Structure):
    # struct landlock_ruleset_attr; the kernel takes the part its ABI knows (8 bytes before ABI 4, 16 before 6).
    _fields_ = [
        ("handled_access_fs", ctypes.c_uint64),
        ("handled_access_net", ctypes.c_uint64),
        ("scoped", ctypes.c_uint64),
    ]


class _PathBeneathAttr(ctypes.Structure):
    _pack_ = 1  # struct landlock_path_beneath_attr is packed
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


@functools.cache
def abi() -> int:
    """The kernel's Landlock ABI version where workers get a domain (2 or later), else 0: none, ABI 1, or a machine
    whose numbers this module does not know."""
    if platform.machine() not in MACHINES:
        return 0
    version = _libc().syscall(CREATE_RULESET, None, ctypes.c_size_t(0), ctypes.c_uint32(CREATE_RULESET_VERSION))
    return version if version >= REFER_ABI else 0


def restrict_self(
    version: int | None = None,
    home: str | None = None,
    names_threads: bool = False,
    unreadable: str | None = None,
    readable: tuple[str, ...] = (),
) -> int:
    """Put the calling process (and every child it will have) in a new domain of `version`'s kind (default: the
    kernel's ABI); needs PR_SET_NO_NEW_PRIVS. With `home`, the domain changes files only beneath `home`, makes no
    socket file even there, writes beneath /dev only to what exists there (devices), and where `names_threads` (a
    CUDA worker), the files of the calling process's own threads; with `unreadable` too, it reads, lists and
    executes nothing beneath `unreadable` but beneath `home` and the `readable` paths (those beside it are granted
    again, in case their parent could not be listed). Returns the version, 0 where there is no Landlock."""
    version = abi() if version is None else min(version, abi())
    if version == 0:
        return 0
    truncate = ACCESS_FS_TRUNCATE if version >= TRUNCATE_ABI else 0
    beneath: tuple[tuple[str, int], ...]
    if home is not None:
        reads = ACCESS_FS_READS if unreadable is not None else 0
        handled_fs = ACCESS_FS_CHANGES | ACCESS_FS_REFER | truncate | reads
        beneath = ((home, handled_fs & ~ACCESS_FS_MAKE_SOCK), ("/dev", ACCESS_FS_WRITE_FILE | truncate))
        if unreadable is not None:
            beneath += _everything_but(unreadable) + tuple(
                (path, reads) for path in _readable_beside(readable, unreadable)
            )
        if names_threads:
            # The CUDA driver names the threads it starts by opening their /proc/self/task/<tid>/comm to write and
            # truncate; refused, its initialisation fails (error 304) and no job sees the GPU. The rule holds for
            # the calling process's own threads alone (the path resolves to its /proc/<pid>/task now), but for all
            # their files: their oom_score_adj too, which such a job may then lower to the service's own where the
            # service lacks CAP_SYS_RESOURCE (compose); no finer rule can name threads not yet started.
            beneath += (("/proc/self/task", ACCESS_FS_WRITE_FILE | truncate),)
    elif version < SCOPES_ABI:
        handled_fs, beneath = ACCESS_FS_REFER, (("/", ACCESS_FS_REFER),)
    else:
        handled_fs, beneath = 0, ()
    if version >= SCOPES_ABI:
        tcp = ACCESS_NET_BIND_TCP | ACCESS_NET_CONNECT_TCP
        attr, size = _RulesetAttr(handled_fs, tcp, SCOPE_SIGNAL | SCOPE_ABSTRACT_UNIX_SOCKET), 24
    elif version >= TCP_ABI:
        attr, size = _RulesetAttr(handled_fs, ACCESS_NET_BIND_TCP | ACCESS_NET_CONNECT_TCP, 0), 16
    else:
        attr, size = _RulesetAttr(handled_fs, 0, 0), 8
    libc = _libc()
    ruleset = libc.syscall(CREATE_RULESET, ctypes.byref(attr), ctypes.c_size_t(size), ctypes.c_uint32(0))
    if ruleset < 0:
        _raise("landlock_create_ruleset")
    try:
        for path, access in beneath:
            _allow_beneath(libc, ruleset, path, access)
        if libc.syscall(RESTRICT_SELF, ctypes.c_int(ruleset), ctypes.c_uint32(0)) != 0:
            _raise("landlock_restrict_self")
    finally:
        os.close(ruleset)
    return version


def _everything_but(unreadable: str) -> tuple[tuple[str, int], ...]:
    """Read rules for everything outside `unreadable`: each entry beside each directory on the way down to it. A
    symbolic link gets none (one there may point beneath `unreadable`; a path through it is read by its target's
    rules). What is made beside those directories later stays unreadable; the directories themselves cannot be
    listed (a rule on one would reach beneath it)."""
    rules = []
    target = Path(unreadable).resolve()
    for step in (*reversed(target.parents[:-1]), target) if target.parents else ():  # `/`: nothing is outside
        try:
            with os.scandir(step.parent) as entries:
                found = [entry for entry in entries if entry.name != step.name and not entry.is_symlink()]
        except PermissionError:  # a directory the service's uid may pass but not list: only `readable` is granted there
            continue
        rules += [(entry.path, ACCESS_FS_READS if entry.is_dir() else ACCESS_FS_FILE_READS) for entry in found]
    return tuple(rules)


def _readable_beside(paths: tuple[str, ...], unreadable: str) -> list[str]:
    """The directories of `paths` that do not hold `unreadable`: beneath it, or beside it where _everything_but could
    not list their parent."""
    target = Path(unreadable).resolve()
    reals = (Path(p).resolve() for p in paths)
    return [str(real) for real in reals if real != target and real not in target.parents and real.is_dir()]


def _allow_beneath(libc: ctypes.CDLL, ruleset: int, path: str, access: int) -> None:
    try:
        directory = os.open(path, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:  # an entry _everything_but saw, removed since: nothing to read there
        return
    try:
        rule = _PathBeneathAttr(access, directory)
        if libc.syscall(ADD_RULE, ctypes.c_int(ruleset), ctypes.c_int(RULE_PATH_BENEATH), ctypes.byref(rule), 0) != 0:
            _raise("landlock_add_rule")
    finally:
        os.close(directory)


def _raise(call: str) -> None:
    code = ctypes.get_errno()
    raise OSError(code, f"{call}: {errno.errorcode.get(code, code)}")
