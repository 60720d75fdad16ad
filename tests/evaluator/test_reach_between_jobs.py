"""What a job can reach of the evaluator's other workers, in both isolation levels, against the real servers. In
`process` isolation every job runs under the service's uid, so the reference's workers are protected by what the
kernel gives a process against its own uid: each worker's Landlock domain, where the kernel has one (no job reaches a
process outside its domain), they are not dumpable (no /proc/<pid>/fd, mem or ptrace), they read nothing from a
file a job could change, and whatever a job does to the timer is that job's verdict."""

from __future__ import annotations

import os
import pwd
import secrets
import struct
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import psutil
import pytest

from services.evaluator import landlock
from tests.evaluator import sources
from tests.evaluator.conftest import FAKE_API_KEY, PROCESS_USER, evaluate_briefly, process_server, server_env
from tests.evaluator.test_namespaces import DAEMON_PRELUDE, reported, surviving_daemons
from tests.servers import run_service


def _landlock_abi(client: httpx.Client) -> int:
    return client.get("/health").json()["details"]["landlock_abi"]


# Every other process of the job's uid that has run for a second (a worker just started is reachable until it
# enters its sandbox: docs/evaluator.md, "Not covered"): its command pipe, opened through /proc.
OPENS_OTHER_WORKERS_PIPES = sources.candidate(
    "return x.clamp_min(0) * self.scale",
    prelude="""
import os, time

def _opened():
    ticks, uptime = os.sysconf("SC_CLK_TCK"), float(open("/proc/uptime").read().split()[0])
    opened = []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) in (os.getpid(), os.getppid()):
            continue
        try:
            if os.stat(f"/proc/{name}").st_uid != os.getuid():
                continue
            started = int(open(f"/proc/{name}/stat").read().rsplit(")", 1)[1].split()[19]) / ticks
            if uptime - started < 1.0:
                continue
            for what in ("fd/0", "mem"):
                fd = os.open(f"/proc/{name}/{what}", os.O_RDONLY | os.O_NONBLOCK)
                os.close(fd)
                opened.append(f"{name}/{what}")
        except OSError:
            continue
    return opened

OPENED = _opened()
if OPENED:
    raise RuntimeError(f"opened /proc/{OPENED}")
""",
)

# Defines `signal_the_others(signum)`: signal every other process of the job's uid but the service.
SIGNALS_THE_OTHERS = """
import os, signal

def signal_the_others(signum):
    for name in os.listdir("/proc"):
        if name.isdigit() and int(name) not in (os.getpid(), os.getppid()):
            try:
                if os.stat(f"/proc/{name}").st_uid == os.getuid():
                    os.kill(int(name), signum)
            except OSError:
                pass
"""


def breaks_its_timer(signum: str) -> str:
    """Sends `signum` to them once its timing has begun (the reference's timer among them: SIGKILL kills it, SIGINT
    makes it raise KeyboardInterrupt and report an error of its own), then answers wrong from its first timed call
    (after 3 trials and 2 warm-up calls: a wrong warm-up is `stale_output` before the timer is used again): never
    `evaluator_error`, which carries no penalty."""
    return sources.candidate(
        f"""
CALLS.append(1)
if len(CALLS) == 4:
    signal_the_others(signal.{signum})
return x.clamp_min(0) * self.scale if len(CALLS) <= 5 else torch.zeros_like(x)
""",
        prelude=SIGNALS_THE_OTHERS + "CALLS = []",
    )


# Stops them at import (the idle workers later evaluations take).
STOPS_THE_IDLE_WORKERS = sources.candidate(
    "return x.clamp_min(0) * self.scale", prelude=SIGNALS_THE_OTHERS + "signal_the_others(signal.SIGSTOP)"
)


# Kills the idle workers at import, so that the service removes their directories (its
# own `chmod -R` and `rm -rf`) while the job watches, and reads the environment of every new process it can see: a
# red-team job found the service's API key in the environment of those children, which are dumpable again once they
# exec. It raises with what it found.
READS_THE_SERVICE_S_CHILDREN = sources.candidate(
    """
CALLS.append(1)
if len(CALLS) == 3:  # the first call after correctness: the judge has just taken the timer, removing the dead
    for _ in range(300):
        if FOUND:
            break
        time.sleep(0.01)
if FOUND:
    raise RuntimeError(f"STOLEN {FOUND}")
return x.clamp_min(0) * self.scale
""",
    prelude="""
import os, signal, threading, time
CALLS, FOUND = [], []

def _kill_idle_workers():
    for name in os.listdir("/proc"):
        try:
            if name.isdigit() and int(name) != os.getpid():
                if b"services.evaluator.worker" in open(f"/proc/{name}/cmdline", "rb").read():
                    os.kill(int(name), signal.SIGKILL)
        except OSError:
            pass

def _read_environments():
    seen, end = set(), time.time() + 60
    while time.time() < end and not FOUND:
        for name in os.listdir("/proc"):
            if not name.isdigit() or name in seen:
                continue
            try:
                environ = open(f"/proc/{name}/environ", "rb").read()
            except OSError:
                continue
            seen.add(name)
            FOUND.extend(item.decode() for item in environ.split(b"\\0") if b"_KEY=" in item)
        seen = {name for name in seen if os.path.exists(f"/proc/{name}")}

_kill_idle_workers()
threading.Thread(target=_read_environments, daemon=True).start()
""",
)


def assert_tampering(result: dict, text: str) -> None:
    assert result["status"] == "rejected" and "result_tampering" in result["flags"], result
    assert text in result["message"], result["message"]


def test_a_job_cannot_read_the_secrets_of_the_processes_the_service_starts(any_client: httpx.Client) -> None:
    result = evaluate_briefly(any_client, READS_THE_SERVICE_S_CHILDREN)
    assert FAKE_API_KEY not in result["message"] and "STOLEN" not in result["message"], result["message"]
    assert result["status"] != "evaluator_error", result["message"]


def test_a_job_cannot_open_the_pipes_or_memory_of_other_workers(any_client: httpx.Client) -> None:
    result = evaluate_briefly(any_client, OPENS_OTHER_WORKERS_PIPES)
    assert result["status"] == "correct", result["message"]


# Watches /proc for a worker the pool is starting (dumpable until it enters its sandbox) and opens its memory for
# reading and writing: a descriptor opened then kept working after the worker turned non-dumpable, and the worker
# could later become a reference run or the timer. Answers right unless it opened one; raises if it saw no worker
# start within 20 s (nothing tried).
HOLDS_A_STARTING_WORKER_S_MEMORY = sources.candidate(
    "return x.clamp_min(0) * self.scale",
    prelude="""
import os, time

def _starting_workers_opened():
    ticks = os.sysconf("SC_CLK_TCK")
    tried, opened, deadline = 0, [], time.monotonic() + 20
    while time.monotonic() < deadline and tried < 3:
        for name in os.listdir("/proc"):
            if not name.isdigit() or int(name) == os.getpid():
                continue
            try:
                if b"services.evaluator.worker" not in open(f"/proc/{name}/cmdline", "rb").read():
                    continue
                started = int(open(f"/proc/{name}/stat").read().rsplit(")", 1)[1].split()[19]) / ticks
                young = float(open("/proc/uptime").read().split()[0]) - started < 0.5
            except OSError:
                continue
            try:
                os.close(os.open(f"/proc/{name}/mem", os.O_RDWR))
                opened.append(name)
            except OSError:
                pass
            tried += young
    if not tried:
        raise RuntimeError("saw no worker start")
    return opened

OPENED = _starting_workers_opened()
if OPENED:
    raise RuntimeError(f"opened the memory of workers {OPENED}")
""",
)


def test_a_job_cannot_hold_the_memory_of_a_worker_that_is_starting(process_client: httpx.Client) -> None:
    """Process isolation (one uid): the kernel's dumpable check is no help while a worker starts; each worker's
    Landlock domain is (landlock.py). Without Landlock the job held a starting worker's memory within 0.01 s."""
    if _landlock_abi(process_client) == 0:
        pytest.skip("no Landlock here: a starting worker is reachable (docs/evaluator.md, Not covered)")
    result = evaluate_briefly(process_client, HOLDS_A_STARTING_WORKER_S_MEMORY)
    assert result["status"] == "correct", result["message"]


# Sets its parent's (in process isolation, the service's) open-file limit to 8 and its nice value to 19 at import,
# then answers wrong. A red-team job did so: its own verdict and every later one were `evaluator_error`.
LIMITS_THE_SERVICE = sources.candidate(
    "return torch.zeros_like(x)",
    prelude="""
import os, resource

for _limit in (lambda: resource.prlimit(os.getppid(), resource.RLIMIT_NOFILE, (8, 8)),
               lambda: os.setpriority(os.PRIO_PROCESS, os.getppid(), 19)):
    try:
        _limit()
    except OSError:
        pass
""",
)


def test_a_job_cannot_set_the_service_s_limits_or_priority(tmp_path_factory: pytest.TempPathFactory) -> None:
    """Process isolation (the service's uid): the seccomp filter refuses limits, priorities and scheduling set for
    any other process. A server of its own: on failure this one is broken."""
    with process_server(tmp_path_factory.mktemp("evaluator-limits") / "server.log") as (client, _):
        result = evaluate_briefly(client, LIMITS_THE_SERVICE)
        assert result["status"] == "incorrect", result["message"]
        result = evaluate_briefly(client, sources.CORRECT)
        assert result["status"] == "correct", result["message"]


def test_a_job_cannot_call_its_service_s_api(process_client: httpx.Client) -> None:
    """Process isolation shares the host's loopback, where the service needs no token. Landlock's TCP rules (ABI 4)
    check `bind` and `connect` alone: red-team jobs called the service's API through an MPTCP socket, which they do
    not reach, and through a TCP Fast Open send, which connects without `connect`; two jobs talked over UDP. The
    seccomp filter refuses every inet socket there."""
    port = process_client.base_url.port
    calls_the_service = sources.candidate(
        "return x.clamp_min(0) * self.scale",
        prelude=f"""
import socket, struct
for _protocol in (0, 262):  # TCP, MPTCP
    try:
        _socket = socket.socket(socket.AF_INET, socket.SOCK_STREAM, _protocol)
        _socket.settimeout(5)
        _socket.connect(("127.0.0.1", {port}))
    except OSError:
        continue
    raise RuntimeError(f"connected to the service on port {port} over protocol {{_protocol}}")
try:  # blocking, so that the send waits for the connection (a socket with a timeout is non-blocking underneath)
    _socket = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    _socket.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, struct.pack("ll", 5, 0))
    _socket.sendto(b"GET /health HTTP/1.0\\r\\n\\r\\n", socket.MSG_FASTOPEN, ("127.0.0.1", {port}))
    _answer = _socket.recv(100)
except OSError:
    pass
else:
    raise RuntimeError(f"reached the service on port {port} by a fast-open send: {{_answer!r}}")
try:
    _socket = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    _socket.sendto(b"to another job", ("127.0.0.1", {port}))
except OSError:
    pass
else:
    raise RuntimeError("sent a datagram on loopback")
""",
    )
    result = evaluate_briefly(process_client, calls_the_service)
    assert result["status"] == "correct", result["message"]


def reaches_process(pid: int) -> str:
    """A candidate that opens the memory and descriptors of process `pid` and signals it (signal 0: only the check),
    and answers right only where all of that failed."""
    return sources.candidate(
        "return x.clamp_min(0) * self.scale",
        prelude=f"""
import os

REACHED = []
for _what in ("mem", "fd/0", "environ"):
    try:
        os.close(os.open("/proc/{pid}/" + _what, os.O_RDONLY))
        REACHED.append(_what)
    except OSError:
        pass
try:
    os.kill({pid}, 0)
    REACHED.append("signal")
except OSError:
    pass
if REACHED:
    raise RuntimeError(f"reached {{REACHED}} of process {pid}")
""",
    )


def test_a_job_reaches_no_process_outside_its_domain_even_of_its_own_uid(process_client: httpx.Client) -> None:
    """A dumpable process of the jobs' uid, as a worker is while it starts: no job opens its memory, descriptors or
    environment, and with Landlock's scopes (ABI 6) none signals it."""
    abi = _landlock_abi(process_client)
    if abi == 0:
        pytest.skip("no Landlock here (docs/evaluator.md, Not covered)")
    user = pwd.getpwnam(PROCESS_USER)
    as_user = ["setpriv", f"--reuid={user.pw_uid}", f"--regid={user.pw_gid}", "--clear-groups", "--"]
    target = subprocess.Popen([*(as_user if os.geteuid() == 0 else []), "sleep", "600"])
    try:
        result = evaluate_briefly(process_client, reaches_process(target.pid))
    finally:
        target.kill()
        target.wait()
    if abi >= landlock.SCOPES_ABI:
        assert result["status"] == "correct", result["message"]
    else:
        assert "signal" in result["message"] and "mem" not in result["message"], result["message"]


# The homes of this service's other workers, as any job can find them: their command lines name them (listing the
# directory they are made in is refused where the job has a Landlock domain).
OTHER_HOMES = """
import json, os

def _other_homes():
    homes, work = set(), os.path.dirname(os.path.dirname(os.getcwd()))
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            words = open(f"/proc/{pid}/cmdline", "rb").read().split(b"\\0")
            homes.add(json.loads(words[words.index(b"--spec") + 1])["home"])
        except (OSError, ValueError):
            continue
    return sorted(home for home in homes if home.startswith(work + "/") and home != os.getcwd())
"""


# Finds the other workers' homes (their command lines name them), then reads and lists what it can there;
# binds a unix socket in its own home (another job could connect to it by its path), and makes each kind of IPC
# object and a pseudo-terminal a job of the host could share; reports what worked, after how many homes it found.
REACHES_OTHER_JOBS_FILES = sources.candidate(
    'raise RuntimeError(f"REACHED {_reach()!r}")',
    prelude=OTHER_HOMES
    + """
import ctypes, socket

def _reach():
    homes = _other_homes()
    reached = []
    for home in homes:
        try:
            reached += [f"{home}: {name}" for name in os.listdir(home)] or [f"{home} listed"]
        except OSError:
            pass
        for name in ("stdio.log", "home/inputs"):
            try:
                open(os.path.join(os.path.dirname(home), name), "rb").read(1)
                reached.append(f"{home}/../{name} read")
            except OSError:
                pass
    try:
        socket.socket(socket.AF_UNIX).bind("own.sock")
        reached.append("socket bound")
    except OSError:
        pass
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.shmget(0, 4096, 0o600) >= 0 or libc.msgget(0, 0o600) >= 0:
        reached.append("SysV IPC made")
    try:
        os.openpty()  # unlocked: another job of the uid could open its other end by its /dev/pts path
        reached.append("pseudo-terminal opened")
    except OSError:
        pass
    return len(homes), reached
""",
)


def test_a_job_reads_nothing_of_another_job_s_in_process_isolation(process_client: httpx.Client) -> None:
    """Candidates evaluated at once could share work through one another's files, sockets or IPC objects, on no
    clock of either's (a red-team job had one compute 842 of another's timed calls through a unix socket bound in
    its home: `correct`, no flag). Where the kernel gives workers a Landlock domain, a job reads nothing beneath the
    directory the workers' are made in but its own home (and the build cache), and binds no socket file; the seccomp
    filter refuses SysV IPC and POSIX message queues where jobs share the host's IPC namespace, and unlocking a
    pseudo-terminal (a red-team pair talked through one, found by a thread's name)."""
    if _landlock_abi(process_client) == 0:
        pytest.skip("no Landlock here (docs/evaluator.md, Not covered)")
    found, reached = reported(evaluate_briefly(process_client, REACHES_OTHER_JOBS_FILES), "REACHED")
    assert found >= 1, "no other worker's home was found: nothing was tried"
    assert reached == [], reached


@pytest.mark.parametrize("signum", ["SIGKILL", "SIGINT"])
def test_a_job_that_breaks_its_timer_gets_a_verdict_of_its_own(any_client: httpx.Client, signum: str) -> None:
    """SIGKILL in process isolation without Landlock's scopes kills the timer: the candidate's `result_tampering`.
    SIGINT, which made the timer raise KeyboardInterrupt (and the next evaluation's reference, in an idle worker),
    is ignored by every worker but a candidate's. Strict isolation, or Landlock's scopes: the signals reach no other
    worker; the zeros are wrong."""
    result = evaluate_briefly(any_client, breaks_its_timer(signum), correctness_trials=3)
    reaches_the_timer = _landlock_abi(any_client) < landlock.SCOPES_ABI
    if (
        signum == "SIGKILL"
        and reaches_the_timer
        and any_client.get("/health").json()["details"]["isolation"] == "process"
    ):
        assert result["status"] == "rejected" and "result_tampering" in result["flags"], (
            result["status"],
            result["message"],
        )
        assert "any job can reach it" in result["message"], result["message"]
    else:
        # A timeout where the machine is loaded enough that its start (37.7 s in one local CI run) takes its time.
        assert result["status"] in ("incorrect", "rejected", "timeout"), result
    after = evaluate_briefly(any_client, sources.CORRECT)
    assert after["status"] == "correct", after["message"]


# Makes a directory where each idle worker will write the reference's source (the one that becomes its timer then
# failed with an error of its own, when that write was not optional). It also touches later evaluations on the
# server, so it gets a server of its own.
PLANTS_IN_THE_IDLE_WORKERS = sources.candidate(
    """
CALLS.append(1)
return x.clamp_min(0) * self.scale if len(CALLS) <= 2 else torch.zeros_like(x)
""",
    prelude="""
import glob, os
CALLS = []
for home in glob.glob(os.path.join(os.path.dirname(os.path.dirname(os.getcwd())), "w*", "home")):
    if home != os.getcwd():
        try:
            os.mkdir(os.path.join(home, "reference.py"))
        except OSError:
            pass
""",
)


def test_a_planted_directory_where_the_timer_writes_the_reference_s_source_changes_nothing(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """The file is only for inspect to read back: the timer times without it, and the zeros are the candidate's."""
    with process_server(tmp_path_factory.mktemp("evaluator-planted") / "server.log") as (client, _):
        result = evaluate_briefly(client, PLANTS_IN_THE_IDLE_WORKERS)
    assert result["status"] in ("incorrect", "rejected") and "result_tampering" not in result["flags"], result


# Kills every other worker of its uid, over and over, from a thread started at import; its answers are right. In
# process isolation the reference's timer is taken only when timing starts (`files` path): every worker the pool
# starts for it is killed before it is ready.
KILLS_EVERY_STARTING_WORKER = sources.candidate(
    "return x.clamp_min(0) * self.scale",
    prelude="""
import os, signal, threading, time

def _kill_workers():
    while True:
        for name in os.listdir("/proc"):
            if name.isdigit() and int(name) != os.getpid():
                try:
                    if b"services.evaluator.worker" in open(f"/proc/{name}/cmdline", "rb").read():
                        os.kill(int(name), signal.SIGKILL)
                except OSError:
                    pass
        time.sleep(0.002)

threading.Thread(target=_kill_workers, daemon=True).start()
""",
)


def test_a_timer_killed_as_it_starts_in_process_isolation_is_the_candidates(process_client: httpx.Client) -> None:
    """A red-team job got `evaluator_error` (no penalty) this way: the timer's start failing was the service's. A
    timer killed once started (before its model is built) is the candidate's too. With Landlock's scopes the job's
    signals reach no worker: its answers are right, and its scanning thread's CPU beside the timed calls may have
    the judge reject its timing, never the timer's failure."""
    result = evaluate_briefly(process_client, KILLS_EVERY_STARTING_WORKER)
    if _landlock_abi(process_client) >= landlock.SCOPES_ABI:
        assert result["status"] in ("correct", "rejected"), result["message"]
        assert "result_tampering" not in result["flags"], result["message"]
    else:
        assert_tampering(result, "the reference timer")
    assert evaluate_briefly(process_client, sources.CORRECT)["status"] == "correct"


# At import, makes every other worker's directories read-only (process isolation: the service's uid), then answers
# wrong.
LOCKS_OTHER_WORKERS_DIRECTORIES = sources.candidate(
    "return torch.zeros_like(x)",
    prelude=OTHER_HOMES
    + """
for _home in _other_homes():
    for _path in (_home, os.path.dirname(_home)):
        try:
            os.chmod(_path, 0o555)
        except OSError:
            pass
""",
)
# Plants a file where the service makes each worker's `inputs` directory, in every other worker's home as it
# appears, then answers wrong.
PLANTS_OTHER_WORKERS_INPUTS = sources.candidate(
    "return torch.zeros_like(x)",
    prelude=OTHER_HOMES
    + """
import threading, time

def _plant():
    while True:
        for home in _other_homes():
            try:
                open(os.path.join(home, "inputs"), "x").close()
            except OSError:
                pass
        time.sleep(0.002)

threading.Thread(target=_plant, daemon=True).start()
""",
)


def test_a_job_that_breaks_other_workers_directories_gets_a_verdict_of_its_own(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """Process isolation, `drawn` data path (the timer is set up after the candidate's import): a job that made the
    idle workers' directories read-only, or planted files where their inputs go, chose `evaluator_error` (no
    penalty) for its wrong answer, and left the idle workers broken for the evaluations after it. Those workers are
    not taken (the first job's timer is a new worker: its own verdict); a timer set up in a directory a job changed
    is the job's. Where the kernel gives workers a Landlock domain, a job can still change the directories' modes,
    but plants nothing."""
    log = tmp_path_factory.mktemp("process-drawn-log") / "server.log"
    with process_server(log, EVALUATOR_DATA_PATH="drawn") as (client, _):
        result = evaluate_briefly(client, LOCKS_OTHER_WORKERS_DIRECTORIES)
        assert result["status"] == "incorrect", result["message"]
        planted = evaluate_briefly(client, PLANTS_OTHER_WORKERS_INPUTS)
        if _landlock_abi(client) == 0:
            assert_tampering(planted, "the reference timer could not be set up")
        else:  # its domain keeps its writes to its own home: nothing is planted, and its wrong answer is its own
            assert planted["status"] == "incorrect", planted["message"]
        result = evaluate_briefly(client, sources.CORRECT)
        assert result["status"] == "correct", result["message"]


# A default ACL with no rights for the owner (user::--- group::r-x other::r-x), which what the service creates in a
# directory that has it inherits.
NO_RIGHTS_BY_DEFAULT = struct.pack("<I", 2) + b"".join(
    struct.pack("<HHI", tag, perm, 0xFFFFFFFF) for tag, perm in ((1, 0), (4, 5), (0x20, 5))
)


@pytest.mark.parametrize("target", ["workers", "work"])
def test_a_default_acl_on_the_workers_directories_breaks_no_later_evaluation(
    process_client: httpx.Client, process_home: Path, target: str
) -> None:
    """A red-team job (process isolation) set default ACLs where the service creates files: the honest evaluations
    after it ended `evaluator_error` as long as idle workers it reached were left (`workers`), or every one after
    the workers started before it (`work`: no worker the service made could start). Jobs can no longer set one (the
    seccomp filter fails every extended attribute set with ENOTSUP), so the test sets them as that job did, on the
    idle workers' directories or the directory the service makes every worker in: the service's own checks of its
    directories are what this tests."""
    assert evaluate_briefly(process_client, sources.CORRECT)["status"] == "correct"
    (work,) = process_home.glob("kernel-agent-evaluator-*")
    roots = [root for root in work.glob("w*-*") if root.is_dir()]
    targets = [work] if target == "work" else [path for root in roots for path in (root / "home", root)]
    assert targets, f"no idle worker in {work}"
    for path in targets:
        os.setxattr(path, "system.posix_acl_default", NO_RIGHTS_BY_DEFAULT)
    for _ in range(4):
        result = evaluate_briefly(process_client, sources.CORRECT)
        assert result["status"] == "correct", result["message"]


# Fills the filesystem its home is on at import (files of at most 64 MiB each, under the file size limit), then
# answers wrong.
FILLS_THE_DISK = sources.candidate(
    "return torch.zeros_like(x)",
    prelude="""
import itertools, os

def _fill():
    block = bytes(1 << 20)
    for index in itertools.count():
        try:
            with open(f"ballast_{index}", "wb") as ballast:
                for _ in range(64):
                    ballast.write(block)
        except OSError:
            return

_fill()
""",
)


@pytest.mark.skipif(os.geteuid() != 0, reason="mounts a small filesystem for the workers")
def test_a_job_that_fills_the_disk_it_shares_with_the_timer_gets_a_verdict_of_its_own(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """Strict isolation, `drawn` data path, the workers' directories on a 200 MiB filesystem: the timer, taken after
    the candidate's import on a CPU, could not be given its inputs, which was `evaluator_error` (no penalty)."""
    # Outside /tmp, which the job's namespace replaces with a filesystem of its own.
    work = Path(tempfile.mkdtemp(prefix="ka-small-disk-", dir="/mnt" if os.path.isdir("/mnt") else None))
    if subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=200m,mode=0755", "tmpfs", str(work)], check=False
    ).returncode:
        pytest.skip("cannot mount a tmpfs here")
    try:
        # No disk per job (on by default where the work directory is a tmpfs): the job shares the timer's.
        env = server_env(
            tmp_path_factory.mktemp("small-disk-cache"), EVALUATOR_DATA_PATH="drawn", EVALUATOR_WORK_DIR=str(work),
            EVALUATOR_JOB_DISK_MB="0",
        )  # fmt: skip
        log = tmp_path_factory.mktemp("small-disk-log") / "server.log"
        with run_service("evaluator", env=env, log_path=log) as url, httpx.Client(base_url=url, timeout=600) as client:
            assert_tampering(evaluate_briefly(client, FILLS_THE_DISK), "the disk the job shares with the judge is full")
            assert evaluate_briefly(client, sources.CORRECT)["status"] == "correct"
    finally:
        subprocess.run(["umount", "-l", str(work)], check=False)
        work.rmdir()


def test_process_isolation_removes_every_finished_workers_directory(
    process_client: httpx.Client, process_home: Path
) -> None:
    """The service, not root there, could not empty the read-only inputs directory it hands over: every worker's
    directory (and on the `files` path every input set) was left behind."""
    for seed in range(3):
        result = evaluate_briefly(process_client, sources.CORRECT, seed=seed)
        assert result["status"] == "correct", result["message"]
    left = [path for path in process_home.glob("kernel-agent-evaluator-*/w*") if path.is_dir()]
    # The idle workers (two per slot) and at most one being replaced.
    assert len(left) <= 2 * 2 + 1, left


def test_workers_a_job_stopped_or_killed_are_not_handed_to_the_next(any_client: httpx.Client) -> None:
    """In process isolation a job can signal the idle workers: a later evaluation gets one resumed, or a fresh one
    for one that was killed (it got `evaluator_error`, the reference's run or timer never answering)."""
    assert evaluate_briefly(any_client, STOPS_THE_IDLE_WORKERS)["status"] == "correct"
    for seed in range(3):
        result = evaluate_briefly(any_client, sources.CORRECT, seed=seed)
        assert result["status"] == "correct", result["message"]


@pytest.mark.parametrize(
    ("forward", "status"), [("os._exit(7)", "crashed"), ("return x.clamp_min(0) * self.scale", "correct")]
)
def test_a_job_s_daemon_dies_in_process_isolation(process_client: httpx.Client, forward: str, status: str) -> None:
    """A double fork with `setsid` takes a process out of its worker's tree, which the judge's stops and the kill
    after the job follow: in `process` isolation a red-team daemon outlived its job holding 60,000 open files. The
    service adopts such processes (a child subreaper) and kills them within a quarter of a second, so none is left
    when the verdict comes, whether the worker exits or the job ends."""
    try:
        result = evaluate_briefly(process_client, sources.candidate(forward, prelude=DAEMON_PRELUDE))
        assert result["status"] == status, result["message"]
        # The worker may exit before the next sweep: a quarter of a second, and the time a scan takes on a busy host.
        assert _none_within(2.0, surviving_daemons), "a setsid daemon outlived its job"
    finally:
        for proc in surviving_daemons():
            proc.kill()


RELAY_MARKER = f"kernel-agent-relay-{secrets.token_hex(6)}"
# A red-team daemon that hands itself down a chain: whichever of its processes is the service's child keeps one child,
# which, when its parent is killed (and it is re-parented to the service), forks the next.
RELAY = """
import os, time
while True:
    if os.fork():
        while True:
            time.sleep(1)
    parent = os.getppid()
    while os.getppid() == parent:
        time.sleep(0.002)
"""
RELAY_PRELUDE = f"""
import os, sys
_child = os.fork()
if _child == 0:
    os.setsid()
    if os.fork() == 0:
        os.execv(sys.executable, [sys.executable, "-c", {RELAY!r}, {RELAY_MARKER!r}])
    os._exit(0)
os.waitpid(_child, 0)
"""


def test_a_relay_of_daemons_dies_with_its_first(process_client: httpx.Client) -> None:
    """Killed one by one, the service's children outran the sweep through a relay, which outlived its job and the
    service, and chmod-ed later evaluations' directories (`runtime_error` for an honest candidate). The sweep stops
    a re-parented process's whole tree before it kills it."""
    try:
        result = evaluate_briefly(
            process_client, sources.candidate("return x.clamp_min(0) * self.scale", prelude=RELAY_PRELUDE)
        )
        assert result["status"] == "correct", result["message"]
        assert _none_within(2.0, lambda: _marked(RELAY_MARKER)), "a relay of daemons outlived its job"
    finally:
        for proc in _marked(RELAY_MARKER):
            proc.kill()


def _marked(marker: str) -> list[psutil.Process]:
    return [
        proc
        for proc in psutil.process_iter(["cmdline", "status"])
        if proc.info["status"] != psutil.STATUS_ZOMBIE and marker in " ".join(proc.info["cmdline"] or [])
    ]


def _none_within(seconds: float, find: Callable[[], list[psutil.Process]]) -> bool:
    deadline = time.monotonic() + seconds
    while find():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


# At import a double fork leaves a sleeping grandchild; every call checks that the worker is still its parent (the
# worker is the subreaper of its job's orphans) and raises with what it found if not.
KEEPS_AN_ORPHAN = sources.candidate(
    """
try:
    parent = int(open(f"/proc/{_ORPHAN}/stat").read().rsplit(")", 1)[1].split()[1])
except OSError:
    parent = None
if parent != os.getpid():
    raise RuntimeError(f"ESCAPED: the orphan's parent is {parent}, the worker {os.getpid()}")
return x.clamp_min(0) * self.scale
""",
    prelude="""
import os, time
_read, _write = os.pipe()
if os.fork() == 0:
    _grandchild = os.fork()
    if _grandchild == 0:
        time.sleep(600)
        os._exit(0)
    os.write(_write, str(_grandchild).encode())
    os._exit(0)
_ORPHAN = int(os.read(_read, 64))
time.sleep(0.1)  # its parent has exited: it is re-parented by now
""",
)


def test_a_job_s_orphans_stay_in_its_worker_s_tree(process_client: httpx.Client) -> None:
    """Process isolation: each worker is the subreaper of its job's orphans, so a double-forked process stays where
    the judge's stops reach it (before, it went to the service and ran on until the sweep killed it)."""
    result = evaluate_briefly(process_client, KEEPS_AN_ORPHAN)
    assert result["status"] == "correct", result["message"]


# A red-team candidate that computes what HEAVY_REFERENCE does (honestly about 1.0x) with a helper in its tree that
# always keeps one double-forked process outside it, whose four spinners burn the CPU whenever the candidate's
# worker is stopped (the reference's turn); each such process lived until the service's next sweep.
ESCAPEE_HOG_HELPER = r"""
import os, sys, time
worker = int(sys.argv[1])

def state(pid):
    try:
        return open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "X"

def spin_while_the_worker_is_stopped():
    for _ in range(3):
        if os.fork() == 0:
            break
    while state(worker) not in ("X", "Z"):
        if state(worker) == "T":
            for _ in range(3000):
                pass
        else:
            time.sleep(0.001)
    os._exit(0)

current = None
while state(worker) not in ("X", "Z"):
    if current is None or state(current) in ("X", "Z"):
        read, write = os.pipe()
        child = os.fork()
        if child == 0:
            grandchild = os.fork()
            if grandchild == 0:
                spin_while_the_worker_is_stopped()
            os.write(write, str(grandchild).encode())
            os._exit(0)
        os.close(write)
        current = int(os.read(read, 64))
        os.close(read)
        os.waitpid(child, 0)
    time.sleep(0.003)
"""
HEAVY_RELU = """
for _ in range(10):
    x = torch.sin(x) + x * 0.5
return torch.relu(x) * self.scale
"""
ESCAPEE_HOG = sources.candidate(
    HEAVY_RELU,
    prelude=f"""
import os, sys
_worker = os.getpid()
if os.fork() == 0:
    os.execv(sys.executable, [sys.executable, "-c", {ESCAPEE_HOG_HELPER!r}, str(_worker)])
""",
)


def test_processes_out_of_the_tree_do_not_slow_the_reference(process_client: httpx.Client) -> None:
    """Process isolation: the hog scored `correct` at 1.6-2.8x, with no flag, in 4 of 5 runs of three, against
    0.4-1.2x for the same computation without it (a loaded 2-core host). Its spinners now stay in the worker's
    tree, and the judge stops them with the candidate."""
    honest = evaluate_briefly(
        process_client, sources.candidate(HEAVY_RELU), sources.HEAVY_REFERENCE, timing_trials=20, timeout_s=240
    )
    top = honest["speedup"] or 1.0
    for _ in range(3):
        hog = evaluate_briefly(process_client, ESCAPEE_HOG, sources.HEAVY_REFERENCE, timing_trials=20, timeout_s=240)
        assert not (hog["status"] == "correct" and (hog["speedup"] or 0) > max(1.5, 1.5 * top)), (hog, top)
