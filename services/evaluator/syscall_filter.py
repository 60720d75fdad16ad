"""A seccomp filter every worker installs last in sandbox.enter(): sockets of the unix and inet families only (unix
alone where jobs share the host's network); no io_uring, perf events, BPF, userfaultfd, kernel keys or file watches;
no SysV IPC or message queues shared with other jobs; no new user namespace; no extended attributes set; no limits,
priorities or scheduling set for another process; no file leases; no pseudo-terminal unlocked; no way out of the
worker's process tree; no SIGCONT sent, now or later.

Why, call by call (each found by a red-team candidate, or a way to what one found):
- netlink sockets: their receive queues hold kernel memory that no memory cgroup is charged for and that no
  process's resident set shows. A candidate queued 4 GiB in `NETLINK_USERSOCK` sockets (its own network namespace
  is enough) against a 2 GiB limit and scored `correct`. A job has no use for netlink or the other families (its
  network namespace has no interface). io_uring can create sockets without the `socket` call (IORING_OP_SOCKET).
- perf_event_open: each event is a kernel object no memory cgroup is charged for; a candidate held 1.5-2 GB of them
  beyond a 1-2 GB limit (processes parked in vfork, so the judge's stop check saw nothing) and scored `correct`;
  inherited events grow with the square of a chain of processes. bpf and userfaultfd are of the same kind of
  kernel reach, with no use in a kernel benchmark.
- add_key, request_key, keyctl: key serials are global and keys outlive the job, its uid and the service: later
  jobs read and overwrote earlier jobs' keys, a channel between evaluations.
- inotify and fanotify (inotify_init, inotify_init1, fanotify_init): a job watching a file every job can read (in
  /etc, the interpreter's, the repository's: the same inodes in every job's namespace, in `strict` isolation too)
  sees each open of it by another job, a channel between candidates evaluated at once (a red-team pair in `process`
  isolation sent a message through it intact, at thousands of bits a second). No kernel benchmark watches files:
  ENOSYS, as on a kernel built without them (libraries that can watch fall back to polling).
- SysV IPC and POSIX message queues (shmget, shmat, msgget, semget, mq_open), in `process` isolation alone: there
  every job shares the host's IPC namespace and uid, so one job's segment or queue is another's to open, a channel
  between candidates evaluated at once (as their files were: landlock.py). In `strict` isolation each job has an
  IPC namespace of its own, with small limits (sandbox.limit_ipc).
- inet sockets, in `process` isolation alone: there jobs share the host's network, and Landlock's rules
  (landlock.py) check TCP's bind and connect calls alone. Red-team jobs called their service's HTTP API on loopback
  through an MPTCP socket (a stream of its own protocol number), through a TCP Fast Open send (`sendto` with
  MSG_FASTOPEN connects without `connect`), and listened on a port `listen` chose without `bind`, which another job
  reached the same way; two jobs evaluated at once talked over UDP. Landlock bars every TCP connection a job could
  make honestly, so no inet socket has a use there: EAFNOSUPPORT, as for the other families. In `strict` isolation
  each job has a network namespace of its own with no interface up.
- setxattr, lsetxattr, fsetxattr, setxattrat: extended attributes on a tmpfs are kernel memory that takes no disk
  block and no resident page. Without job cgroups, a candidate held 1.5 GB of them on its private /dev/shm against
  a 1 GiB limit and scored `correct` (the memory watch counts a job disk's blocks). They fail with ENOTSUP, as on
  a filesystem without them (what `shutil.copy2` and `cp -a` ignore).
- resource limits, priorities and scheduling of another process (prlimit64 with a pid, setpriority and ioprio_set of
  anything but the caller, sched_setscheduler, sched_setparam and sched_setattr with a pid): the kernel allows them
  between processes of one uid, and Landlock has no check for them. In `process` isolation a red-team job set the
  service's open-file limit to 8 through prlimit64: its own wrong answer and every later evaluation ended
  `evaluator_error` until the service restarted. A job may still change its own (pid 0, as the C library's
  setrlimit, nice and sched_setscheduler calls pass); other pids get EPERM. sched_setaffinity stays open: the worker
  pins its own threads by their ids, which a filter cannot tell from another process's.
- file leases (fcntl F_SETLEASE): a lease on a file makes every other process's open of it that conflicts wait
  for the lease's holder, up to the kernel's lease-break-time (45 s by default), or fail with EAGAIN where it does
  not block. The kernel lets a file's owner take one, so in `process` isolation a red-team daemon took leases on
  the build cache's libraries and on the reference's saved files: the service's event loop stalled for 45 s on a
  cache hit, and every later evaluation that ran a reference ended `evaluator_error`. In `strict` isolation a job
  owns its saved outputs, which the service opens. No kernel benchmark needs a lease: EPERM.
- pseudo-terminals unlocked (ioctl TIOCSPTLCK, what unlockpt and openpty call): a job may open `/dev/ptmx` (its
  devices are writable), and in `process` isolation another job of the same uid could open that terminal's other
  end: a red-team pair named the terminal in a thread's name and talked both ways through it. A terminal never
  unlocked has no other end to open, here or in any job. No kernel benchmark needs one: EPERM.
- a process out of the worker's process tree (clone with CLONE_PARENT, which makes the worker's parent, the service,
  the new process's; prctl PR_SET_CHILD_SUBREAPER, which would clear the flag that keeps a `process`-isolation
  worker's orphans its own, sandbox.enter): the judge stops a job by its worker's tree, and in `process` isolation a
  red-team helper kept a double-forked process outside it, re-parented to the service, that spun while the
  candidate was stopped and slowed the reference's turns until the service's sweep killed it: `correct` at 1.6-2.8x
  for a copy of the reference. EPERM.
- user namespaces (clone or unshare with CLONE_NEWUSER; clone3, whose flags sit in memory a filter cannot read,
  fails with ENOSYS and the C library falls back to clone, as under Docker's default profile): inside one a job
  holds every capability over its own namespaces, the kernel surface most privilege escalations have gone through.
- SIGCONT, and every way to have a signal of one's choice sent later but on an exit (timer_create and mq_notify,
  whose signal sits in memory a filter cannot read: ENOSYS; fcntl F_SETSIG, the signal for a file's events: EPERM):
  the judge holds a job stopped while it times or checks the other side, and only SIGCONT undoes a stop. A
  red-team helper armed SIGCONT timers, then sat in long O_DIRECT writes: a thread in the kernel at a stop is taken
  as held, its timer undid the stop pending for it, it ran a little code and was back in a write before the check,
  which then saw nothing (`strict`: unflagged in 3 runs of 9). A stop must also hold against a thread in the kernel
  that sends a signal as its call ends (kill, tkill, tgkill, rt_sigqueueinfo, rt_tgsigqueueinfo and
  pidfd_send_signal read their siginfo from memory, which can fault and wait on a disk): each is refused SIGCONT
  (EPERM), and no kernel benchmark or tool sends one. A terminal's leader still sends SIGCONT at once by giving
  up its terminal (ioctl TIOCNOTTY), a running sender as any other, which the stop's re-reads outlast. What is
  left to resume a held job is the kernel's own SIGCONT, after an exit (to an orphaned stopped process group; an
  exit or parent-death signal, which clone and prctl may still choose) or a terminal's hangup: sandbox._may_resume.

The filter is classic BPF over `struct seccomp_data`, loaded with prctl(PR_SET_SECCOMP): no library is needed, and
the filter is a few dozen instructions. It is inherited by every child and cannot be removed. A system call of
another ABI than the process's own (i386 through `int 0x80`, x32 on x86-64, whose `socketcall` or numbering would
miss the checks) fails with ENOSYS.
"""

from __future__ import annotations

import ctypes
import errno
import platform
import signal
import socket
from dataclasses import dataclass

PR_SET_SECCOMP = 22
SECCOMP_MODE_FILTER = 2
SECCOMP_RET_ALLOW = 0x7FFF0000
SECCOMP_RET_ERRNO = 0x00050000
# Classic BPF opcodes: BPF_LD|BPF_W|BPF_ABS, BPF_JMP|BPF_JEQ|BPF_K, BPF_JMP|BPF_JGE|BPF_K, BPF_JMP|BPF_JSET|BPF_K,
# BPF_RET|BPF_K.
LOAD_WORD, JUMP_IF_EQUAL, JUMP_IF_AT_LEAST, JUMP_IF_ANY_BIT, RETURN = 0x20, 0x15, 0x35, 0x45, 0x06
# Offsets in struct seccomp_data: the call's number, its ABI, the low words of its first three arguments
# (little-endian).
NR_OFFSET, ARCH_OFFSET, FIRST_ARGUMENT_OFFSET, SECOND_ARGUMENT_OFFSET, THIRD_ARGUMENT_OFFSET = 0, 4, 16, 24, 32
X32_SYSCALL_BIT = 0x40000000
CLONE_NEWUSER = 0x10000000
CLONE_PARENT = 0x00008000
PR_SET_CHILD_SUBREAPER = 36


@dataclass(frozen=True)
class Machine:
    arch: int  # AUDIT_ARCH_*
    socket: int
    clone: int
    unshare: int
    # Calls that fail with ENOSYS: io_uring_setup, _enter, _register, clone3 (the same numbers on both machines),
    # perf_event_open, bpf, userfaultfd, add_key, request_key, keyctl, timer_create, mq_notify, then inotify_init
    # (x86-64 alone), inotify_init1, fanotify_init.
    refused: tuple[int, ...]
    # Calls that fail with ENOSYS where the job has no IPC namespace of its own: shmget, shmat, msgget, semget,
    # mq_open.
    shared_ipc: tuple[int, ...]
    # Calls that fail with ENOTSUP: setxattr, lsetxattr, fsetxattr, setxattrat (463 on both).
    xattr_setters: tuple[int, ...]
    # Calls allowed with a first argument (a pid) of 0 alone, the caller: prlimit64, sched_setparam,
    # sched_setscheduler, sched_setattr.
    own_process_only: tuple[int, ...]
    # setpriority and ioprio_set: allowed for (PRIO_PROCESS, 0) and (IOPRIO_WHO_PROCESS, 0) alone.
    setpriority: int
    ioprio_set: int
    fcntl: int  # refused with F_SETLEASE or F_SETSIG
    prctl: int  # refused with PR_SET_CHILD_SUBREAPER
    ioctl: int  # refused with TIOCSPTLCK
    # Calls that send a signal, each with its signal's offset in struct seccomp_data: refused with SIGCONT. kill,
    # tkill, tgkill, rt_sigqueueinfo, rt_tgsigqueueinfo, pidfd_send_signal (424 on both).
    signal_senders: tuple[tuple[int, int], ...]


MACHINES = {
    "x86_64": Machine(
        0xC000003E,
        41,
        56,
        272,
        (425, 426, 427, 435, 298, 321, 323, 248, 249, 250, 222, 244, 253, 294, 300),
        (29, 30, 68, 64, 240),
        (188, 189, 190, 463),
        (302, 142, 144, 314),
        141,
        251,
        72,
        157,
        16,
        (
            (62, SECOND_ARGUMENT_OFFSET),
            (200, SECOND_ARGUMENT_OFFSET),
            (234, THIRD_ARGUMENT_OFFSET),
            (129, SECOND_ARGUMENT_OFFSET),
            (297, THIRD_ARGUMENT_OFFSET),
            (424, SECOND_ARGUMENT_OFFSET),
        ),
    ),
    "aarch64": Machine(
        0xC00000B7,
        198,
        220,
        97,
        (425, 426, 427, 435, 241, 280, 282, 217, 218, 219, 107, 184, 26, 262),
        (194, 196, 186, 190, 180),
        (5, 6, 7, 463),
        (261, 118, 119, 274),
        140,
        30,
        25,
        167,
        29,
        (
            (129, SECOND_ARGUMENT_OFFSET),
            (130, SECOND_ARGUMENT_OFFSET),
            (131, THIRD_ARGUMENT_OFFSET),
            (138, SECOND_ARGUMENT_OFFSET),
            (240, THIRD_ARGUMENT_OFFSET),
            (424, SECOND_ARGUMENT_OFFSET),
        ),
    ),
}
PRIO_PROCESS, IOPRIO_WHO_PROCESS = 0, 1
F_SETLEASE, F_SETSIG = 1024, 10
TIOCSPTLCK = 0x40045431  # the same on both machines
ALLOWED_SOCKET_FAMILIES = (socket.AF_UNIX, socket.AF_INET, socket.AF_INET6)  # unix alone where jobs share a network


class _SockFilter(ctypes.Structure):
    _fields_ = [("code", ctypes.c_ushort), ("jt", ctypes.c_ubyte), ("jf", ctypes.c_ubyte), ("k", ctypes.c_uint32)]


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(_SockFilter))]


def program(machine: str, own_namespaces: bool = True) -> list[tuple[int, int, int, int]]:
    """The filter's instructions (code, jump if true, jump if false, k) for `machine`, top to bottom, for a job with
    IPC and network namespaces of its own or one sharing the host's. A jump skips that many instructions after
    itself."""
    calls = MACHINES[machine]
    refused = calls.refused + (() if own_namespaces else calls.shared_ipc)
    allow = (RETURN, 0, 0, SECCOMP_RET_ALLOW)
    no_such_call = (RETURN, 0, 0, SECCOMP_RET_ERRNO | errno.ENOSYS)
    # Another ABI than the process's own: ENOSYS.
    instructions = [(LOAD_WORD, 0, 0, ARCH_OFFSET), (JUMP_IF_EQUAL, 1, 0, calls.arch), no_such_call]
    instructions.append((LOAD_WORD, 0, 0, NR_OFFSET))
    if machine == "x86_64":  # x32 numbers carry this bit
        instructions += [(JUMP_IF_AT_LEAST, 0, 1, X32_SYSCALL_BIT), no_such_call]
    # Refused calls: each check jumps to the ENOSYS after the last; the last one's "false" skips that return.
    last = len(refused) - 1
    instructions += [(JUMP_IF_EQUAL, last - i, int(i == last), nr) for i, nr in enumerate(refused)]
    instructions.append(no_such_call)
    # Extended attributes set: ENOTSUP, the same way.
    last = len(calls.xattr_setters) - 1
    instructions += [(JUMP_IF_EQUAL, last - i, int(i == last), nr) for i, nr in enumerate(calls.xattr_setters)]
    instructions.append((RETURN, 0, 0, SECCOMP_RET_ERRNO | errno.ENOTSUP))
    # clone or unshare with CLONE_NEWUSER or CLONE_PARENT in their flags (the first argument of both): EPERM.
    instructions += [
        (JUMP_IF_EQUAL, 1, 0, calls.clone),
        (JUMP_IF_EQUAL, 0, 3, calls.unshare),
        (LOAD_WORD, 0, 0, FIRST_ARGUMENT_OFFSET),
        (JUMP_IF_ANY_BIT, 0, 1, CLONE_NEWUSER | CLONE_PARENT),
        (RETURN, 0, 0, SECCOMP_RET_ERRNO | errno.EPERM),
        (LOAD_WORD, 0, 0, NR_OFFSET),
    ]
    # Another process's limits, priority or scheduling: EPERM (the caller's own, pid 0: allowed).
    not_permitted = (RETURN, 0, 0, SECCOMP_RET_ERRNO | errno.EPERM)
    for nr in calls.own_process_only:
        instructions += [
            (JUMP_IF_EQUAL, 0, 4, nr),
            (LOAD_WORD, 0, 0, FIRST_ARGUMENT_OFFSET),
            (JUMP_IF_EQUAL, 1, 0, 0),
            not_permitted,
            allow,
        ]
    for nr, which in ((calls.setpriority, PRIO_PROCESS), (calls.ioprio_set, IOPRIO_WHO_PROCESS)):
        instructions += [
            (JUMP_IF_EQUAL, 0, 6, nr),
            (LOAD_WORD, 0, 0, FIRST_ARGUMENT_OFFSET),
            (JUMP_IF_EQUAL, 0, 2, which),
            (LOAD_WORD, 0, 0, SECOND_ARGUMENT_OFFSET),
            (JUMP_IF_EQUAL, 1, 0, 0),
            not_permitted,
            allow,
        ]
    # A file lease or another signal for a file's events, a child subreaper set or cleared, a pseudo-terminal
    # unlocked, SIGCONT sent: EPERM. Each
    # value checked jumps to the EPERM after the last; the last one's "false" skips that return.
    for nr, offset, refused in (
        (calls.fcntl, SECOND_ARGUMENT_OFFSET, (F_SETLEASE, F_SETSIG)),
        (calls.prctl, FIRST_ARGUMENT_OFFSET, (PR_SET_CHILD_SUBREAPER,)),
        (calls.ioctl, SECOND_ARGUMENT_OFFSET, (TIOCSPTLCK,)),
        *((sender, offset, (signal.SIGCONT,)) for sender, offset in calls.signal_senders),
    ):
        last = len(refused) - 1
        instructions += [(JUMP_IF_EQUAL, 0, len(refused) + 3, nr), (LOAD_WORD, 0, 0, offset)]
        instructions += [(JUMP_IF_EQUAL, last - i, int(i == last), value) for i, value in enumerate(refused)]
        instructions += [not_permitted, allow]
    # Any call but socket: allowed. socket: its family must be one of ours (each check jumps to the last "allow").
    instructions += [(JUMP_IF_EQUAL, 1, 0, calls.socket), allow, (LOAD_WORD, 0, 0, FIRST_ARGUMENT_OFFSET)]
    allowed = ALLOWED_SOCKET_FAMILIES if own_namespaces else (socket.AF_UNIX,)
    instructions += [(JUMP_IF_EQUAL, len(allowed) - i, 0, family) for i, family in enumerate(allowed)]
    instructions += [(RETURN, 0, 0, SECCOMP_RET_ERRNO | errno.EAFNOSUPPORT), allow]
    return instructions


def install(own_namespaces: bool) -> None:
    """Load the filter into the calling process (needs PR_SET_NO_NEW_PRIVS or CAP_SYS_ADMIN). A machine the filter
    does not know gets none (its socket families are then unfiltered)."""
    machine = platform.machine()
    if machine not in MACHINES:
        return
    instructions = program(machine, own_namespaces)
    filters = (_SockFilter * len(instructions))(*(_SockFilter(*i) for i in instructions))
    prog = _SockFprog(len(instructions), filters)
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.byref(prog), 0, 0) != 0:
        code = ctypes.get_errno()
        raise OSError(code, f"prctl(PR_SET_SECCOMP): {errno.errorcode.get(code, code)}")
