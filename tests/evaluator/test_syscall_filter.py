"""The workers' seccomp filter, installed in a real process: unix and inet sockets, threads and child processes
work; netlink and packet sockets, io_uring, perf events, kernel keys, file watches, new user namespaces, extended
attributes and another process's limits, priorities and scheduling, file leases, unlocked pseudo-terminals, ways out
of the process tree and SIGCONT, sent or armed, do not, nor, without IPC and network namespaces of the job's own,
SysV IPC, POSIX message queues and inet sockets; and children inherit it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]

# Installs the filter as a worker does (no new privileges first), then reports what each call gave.
PROBE = """
import ctypes, errno, json, os, platform, socket, subprocess, sys, threading
from services.evaluator import syscall_filter
calls = syscall_filter.MACHINES[platform.machine()]
libc = ctypes.CDLL(None, use_errno=True)
libc.prctl(38, 1, 0, 0, 0)  # PR_SET_NO_NEW_PRIVS
syscall_filter.install(own_namespaces=sys.argv[2] == "own")
results = {}
# SysV IPC and POSIX message queues, each made private and removed at once where the filter lets it through.
libc.mq_open.argtypes = [ctypes.c_char_p, ctypes.c_int, ctypes.c_int, ctypes.c_void_p]
queue = f"/kernel-agent-probe-{os.getpid()}".encode()
for name, make, remove in (
    ("shmget", lambda: libc.shmget(0, 4096, 0o600), lambda made: libc.shmctl(made, 0, None)),  # IPC_RMID
    ("msgget", lambda: libc.msgget(0, 0o600), lambda made: libc.msgctl(made, 0, None)),
    ("semget", lambda: libc.semget(0, 1, 0o600), lambda made: libc.semctl(made, 0, 0)),
    ("mq_open", lambda: libc.mq_open(queue, os.O_CREAT | os.O_RDWR, 0o600, None), lambda made: libc.mq_unlink(queue)),
):
    made = make()
    results[name] = errno.errorcode[ctypes.get_errno()] if made < 0 else "ok"
    if made >= 0:
        remove(made)
results["shmat"] = "ok" if libc.shmat(-1, None, 0) not in (None, -1) else errno.errorcode[ctypes.get_errno()]
# inet sockets of each kind (type, protocol), by the C library's call: a TCP stream, the default stream, UDP, MPTCP.
libc.socket.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int]
for family in ("AF_INET", "AF_INET6"):
    for kind, type_, protocol in (
        ("tcp", socket.SOCK_STREAM | socket.SOCK_CLOEXEC, socket.IPPROTO_TCP), ("stream", socket.SOCK_STREAM, 0),
        ("udp", socket.SOCK_DGRAM, 0), ("mptcp", socket.SOCK_STREAM, 262),
    ):
        made = libc.socket(getattr(socket, family), type_, protocol)
        results[f"{family}_{kind}"] = errno.errorcode[ctypes.get_errno()] if made < 0 else "ok"
        if made >= 0:
            os.close(made)
for name in ("AF_UNIX", "AF_INET", "AF_INET6", "AF_NETLINK", "AF_PACKET"):
    try:
        socket.socket(getattr(socket, name), socket.SOCK_DGRAM if name != "AF_NETLINK" else socket.SOCK_RAW).close()
        results[name] = "ok"
    except OSError as error:
        results[name] = errno.errorcode[error.errno]
setup = libc.syscall(425, 4, None)  # io_uring_setup on x86-64 and arm64 alike
results["io_uring_setup"] = "ok" if setup >= 0 else errno.errorcode[ctypes.get_errno()]
results["socketpair"] = "ok" if socket.socketpair() else "failed"
for name, nr in zip(("perf_event_open", "bpf", "userfaultfd", "add_key", "request_key", "keyctl"), calls.refused[4:]):
    results[name] = "ok" if libc.syscall(nr, 0, 0, 0, 0, 0) >= 0 else errno.errorcode[ctypes.get_errno()]
results["unshare_user"] = "ok" if libc.unshare(0x10000000) == 0 else errno.errorcode[ctypes.get_errno()]
# File watches, by the C library's calls: another job's opens of a file both can read would be a channel.
results["inotify_init1"] = "ok" if libc.inotify_init1(0) >= 0 else errno.errorcode[ctypes.get_errno()]
results["fanotify_init"] = "ok" if libc.fanotify_init(0, 0) >= 0 else errno.errorcode[ctypes.get_errno()]
with open(sys.argv[1], "w") as handle:
    for name, call in (("setxattr", lambda: os.setxattr(sys.argv[1], "user.held", b"x" * 1024)),
                       ("fsetxattr", lambda: os.setxattr(handle.fileno(), "user.held", b"x")),
                       ("lsetxattr", lambda: os.setxattr(sys.argv[1], "user.held", b"x", follow_symlinks=False))):
        try:
            call()
            results[name] = "ok"
        except OSError as error:
            results[name] = errno.errorcode[error.errno]
    setxattrat = libc.syscall(463, -100, sys.argv[1].encode(), 0, b"user.held", None, 0)
    results["setxattrat"] = "ok" if setxattrat == 0 else errno.errorcode[ctypes.get_errno()]
results["unshare_ipc"] = "ok" if libc.unshare(0x08000000) == 0 else errno.errorcode[ctypes.get_errno()]
# Another process's limits, priority, I/O priority and scheduling (each set to what it is, should one get through),
# then the caller's own.
import resource
parent, nofile = os.getppid(), resource.getrlimit(resource.RLIMIT_NOFILE)
ioprio_get, ioprio_set = (252, 251) if platform.machine() == "x86_64" else (31, 30)
for name, call in (
    ("prlimit_other", lambda: resource.prlimit(parent, resource.RLIMIT_NOFILE, nofile)),
    ("setpriority_other", lambda: os.setpriority(os.PRIO_PROCESS, parent, os.getpriority(os.PRIO_PROCESS, parent))),
    ("sched_setscheduler_other", lambda: os.sched_setscheduler(parent, os.sched_getscheduler(parent), os.sched_param(0))),
    ("sched_setparam_other", lambda: os.sched_setparam(parent, os.sched_getparam(parent))),
    ("setrlimit_own", lambda: resource.setrlimit(resource.RLIMIT_NOFILE, nofile)),
    ("prlimit_own", lambda: resource.prlimit(0, resource.RLIMIT_NOFILE, nofile)),
    ("nice_own", lambda: os.nice(0)),
    ("sched_setscheduler_own", lambda: os.sched_setscheduler(0, os.SCHED_OTHER, os.sched_param(0))),
):
    try:
        call()
        results[name] = "ok"
    except OSError as error:
        results[name] = errno.errorcode[error.errno]
for name, pid in (("ioprio_set_other", parent), ("ioprio_set_own", 0)):
    current = libc.syscall(ioprio_get, 1, pid)  # IOPRIO_WHO_PROCESS
    results[name] = "ok" if libc.syscall(ioprio_set, 1, pid, current) == 0 else errno.errorcode[ctypes.get_errno()]
# A lease on a file of the caller's own (which the service may open); other fcntl calls and locks still work.
import fcntl
lease_fd = os.open(sys.argv[1], os.O_RDONLY)
for name, call in (
    ("lease", lambda: fcntl.fcntl(lease_fd, fcntl.F_SETLEASE, fcntl.F_RDLCK)),
    ("fcntl_getfl", lambda: fcntl.fcntl(lease_fd, fcntl.F_GETFL)),
    ("flock", lambda: fcntl.flock(lease_fd, fcntl.LOCK_SH)),
):
    try:
        call()
        results[name] = "ok"
    except OSError as error:
        results[name] = errno.errorcode[error.errno]
# A pseudo-terminal: made, but not unlocked (so its other end cannot be opened), nor one opened whole.
import struct
master = os.open("/dev/ptmx", os.O_RDWR | os.O_NOCTTY)
for name, call in (
    ("unlockpt", lambda: fcntl.ioctl(master, 0x40045431, struct.pack("i", 0))),  # TIOCSPTLCK
    ("openpty", lambda: [os.close(end) for end in os.openpty()]),
    ("tcgetattr", lambda: __import__("termios").tcgetattr(master)),
):
    try:
        call()
        results[name] = "ok"
    except OSError as error:
        results[name] = errno.errorcode[error.errno]
# Out of the caller's process tree: a child of its parent (CLONE_PARENT, with the signal a fork sends), or the
# subreaper flag set or cleared; reading the flag still works.
import signal
child = libc.syscall(calls.clone, 0x00008000 | signal.SIGCHLD, 0, 0, 0, 0)
if child == 0:
    os._exit(0)  # the filter let it through: a child of the test, gone at once
results["clone_parent"] = "ok" if child > 0 else errno.errorcode[ctypes.get_errno()]
results["set_subreaper"] = "ok" if libc.prctl(36, 0, 0, 0, 0) == 0 else errno.errorcode[ctypes.get_errno()]
flag = ctypes.c_int(-1)
results["get_subreaper"] = "ok" if libc.prctl(37, ctypes.byref(flag), 0, 0, 0) == 0 else errno.errorcode[ctypes.get_errno()]
# SIGCONT, sent now or armed to come later (a timer, a message queue's or a file's events), through the C library's
# own calls; other signals still go.
import signal, struct
sigcont_event = ctypes.create_string_buffer(struct.pack("<qii", 0, signal.SIGCONT, 0), 64)  # SIGEV_SIGNAL
timer = ctypes.c_void_p()
info = ctypes.create_string_buffer(struct.pack("<iii", signal.SIGCONT, 0, -1), 128)  # SI_QUEUE
tkill = 200 if platform.machine() == "x86_64" else 130
pidfd = os.pidfd_open(os.getpid())
for name, call in (
    ("timer_create", lambda: libc.timer_create(1, sigcont_event, ctypes.byref(timer))),  # CLOCK_MONOTONIC
    ("mq_notify", lambda: libc.mq_notify(-1, sigcont_event)),
    ("kill_sigcont", lambda: libc.kill(os.getpid(), signal.SIGCONT)),
    ("tkill_sigcont", lambda: libc.syscall(tkill, threading.get_native_id(), signal.SIGCONT)),
    ("tgkill_sigcont", lambda: libc.pthread_kill(ctypes.c_ulong(threading.get_ident()), signal.SIGCONT)),
    ("sigqueue_sigcont", lambda: libc.sigqueue(os.getpid(), signal.SIGCONT, ctypes.c_void_p(0))),
    ("pthread_sigqueue_sigcont",
     lambda: libc.pthread_sigqueue(ctypes.c_ulong(threading.get_ident()), signal.SIGCONT, ctypes.c_void_p(0))),
    ("pidfd_send_signal_sigcont", lambda: libc.syscall(424, pidfd, signal.SIGCONT, info, 0)),
    ("f_setsig", lambda: libc.fcntl(lease_fd, 10, signal.SIGCONT)),  # F_SETSIG
    ("f_setown", lambda: libc.fcntl(lease_fd, 8, os.getpid())),  # F_SETOWN
    ("kill_sigurg", lambda: libc.kill(os.getpid(), signal.SIGURG)),  # ignored by default
):
    ctypes.set_errno(0)
    outcome = call()
    # pthread_kill (tgkill) and pthread_sigqueue return the error; the others set errno.
    returns_error = name in ("tgkill_sigcont", "pthread_sigqueue_sigcont")
    code = outcome if returns_error else ctypes.get_errno() if outcome != 0 else 0
    results[name] = "ok" if code == 0 else errno.errorcode[code]
ran = []
thread = threading.Thread(target=ran.append, args=(1,))
thread.start(); thread.join()
results["thread"] = "ok" if ran else "failed"
child = "import socket\\ntry:\\n socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, 2)\\n print('ok')\\nexcept OSError as e:\\n print(e.errno)"
results["child_netlink"] = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True).stdout.strip()
print(json.dumps(results))
"""


@pytest.mark.skipif(sys.platform != "linux", reason="seccomp is Linux's")
@pytest.mark.parametrize("ipc", ["own", "shared"])
def test_the_filter_allows_unix_and_inet_sockets_only(tmp_path: Path, ipc: str) -> None:
    """`own`: a strict-isolation worker's, in IPC and network namespaces of its own; `shared`: a process-isolation
    worker's, in the host's."""
    probe = subprocess.run(
        [sys.executable, "-c", PROBE, str(tmp_path / "file"), ipc], capture_output=True, text=True, cwd=REPO_ROOT,
        timeout=60, check=True,
    )  # fmt: skip
    results = json.loads(probe.stdout)
    # Without IPC and network namespaces of its own, a job would share these with every other job: channels between
    # them, and through MPTCP or a TCP Fast Open send (which Landlock's TCP rules do not reach) its service's API.
    made = ("shmget", "msgget", "semget", "mq_open")
    inet = [f"{family}_{kind}" for family in ("AF_INET", "AF_INET6") for kind in ("tcp", "stream", "udp", "mptcp")]
    if ipc == "own":
        assert {results[name] for name in made} == {"ok"} and results["shmat"] == "EINVAL", results
        assert {results[name] for name in inet if "mptcp" not in name} == {"ok"}, results  # MPTCP: the kernel's
    else:
        assert {results[name] for name in (*made, "shmat")} == {"ENOSYS"}, results
        assert {results[name] for name in inet} == {"EAFNOSUPPORT"}, results
    assert results["AF_UNIX"] == results["socketpair"] == "ok", results
    assert results["AF_INET"] == results["AF_INET6"] == ("ok" if ipc == "own" else "EAFNOSUPPORT"), results
    assert results["AF_NETLINK"] == results["AF_PACKET"] == "EAFNOSUPPORT", results
    assert results["io_uring_setup"] == "ENOSYS", results
    refused = ("perf_event_open", "bpf", "userfaultfd", "add_key", "request_key", "keyctl", "inotify_init1")
    refused += ("fanotify_init",)
    assert {results[name] for name in refused} == {"ENOSYS"}, results
    assert results["unshare_user"] == "EPERM" and results["thread"] == "ok", results
    # Other namespaces are the kernel's to allow (here: not without CAP_SYS_ADMIN, which an unprivileged run lacks).
    assert results["unshare_ipc"] != "EPERM" or os.geteuid() != 0, results
    assert results["child_netlink"] == "97", results  # EAFNOSUPPORT in a child too
    # Extended attributes are kernel memory no job disk's count sees.
    assert {results[name] for name in ("setxattr", "fsetxattr", "lsetxattr", "setxattrat")} == {"ENOTSUP"}, results
    # Another process of the uid (the service, in process isolation) is out of reach; the caller itself is not.
    others = ("prlimit_other", "setpriority_other", "sched_setscheduler_other", "sched_setparam_other")
    assert {results[name] for name in (*others, "ioprio_set_other")} == {"EPERM"}, results
    own = ("setrlimit_own", "prlimit_own", "nice_own", "sched_setscheduler_own", "ioprio_set_own")
    assert {results[name] for name in own} == {"ok"}, results
    # A lease would make the service's opens of the file wait or fail.
    assert results["lease"] == "EPERM" and results["fcntl_getfl"] == results["flock"] == "ok", results
    # Another job could open an unlocked terminal's other end: a channel between them. Other terminal calls work.
    assert results["unlockpt"] == results["openpty"] == "EPERM" and results["tcgetattr"] == "ok", results
    # The judge stops a job by its worker's process tree: nothing may leave it.
    assert results["clone_parent"] == results["set_subreaper"] == "EPERM" and results["get_subreaper"] == "ok", results
    # Only SIGCONT undoes the judge's stop: none is sent, nor armed to come while the job is held.
    assert results["timer_create"] == results["mq_notify"] == "ENOSYS", results
    senders = ("kill", "tkill", "tgkill", "sigqueue", "pthread_sigqueue", "pidfd_send_signal")
    assert {results[f"{name}_sigcont"] for name in senders} | {results["f_setsig"]} == {"EPERM"}, results
    assert results["f_setown"] == results["kill_sigurg"] == "ok", results
