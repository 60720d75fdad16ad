"""Isolation promises of strict mode, one test each, against the real server."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from urllib.parse import urlparse

import httpx
import psutil
import pytest

from services.evaluator import sandbox
from services.evaluator.pool import uid_count
from services.evaluator.sandbox import (
    JobStop,
    ThreadMark,
    _stop_marks,
    _thread_marks,
    child_env,
    job_pids,
    ran_since_stop,
    stop_job,
)
from tests.evaluator import sources
from tests.evaluator.conftest import WORKERS, evaluate_briefly, sandbox_uid_base, server_env
from tests.servers import REPO, run_service


def sandbox_processes() -> list[psutil.Process]:
    uids = range(sandbox_uid_base(), sandbox_uid_base() + uid_count(WORKERS))
    return [p for p in psutil.process_iter(["uids"]) if p.info["uids"] and p.info["uids"].real in uids]


def test_workers_import_from_the_services_python_path(tmp_path: Path) -> None:
    """A package installed beside the service through PYTHONPATH (tree-sitter on the GPU machine) imports in its
    workers too: without it every split build there quietly built whole. The project comes first; a relative entry,
    which would resolve against the worker's own directory, is left out."""
    site = tmp_path / "site"
    site.mkdir(mode=0o755)
    env = child_env(tmp_path, build_jobs=2, threads=1, source={"PYTHONPATH": f"{site}:relative:{REPO}"})
    assert env["PYTHONPATH"].split(":") == [str(REPO), str(site)]
    assert child_env(tmp_path, build_jobs=2, threads=1, source={})["PYTHONPATH"] == str(REPO)


def test_workers_never_import_from_a_folder_other_users_can_write(tmp_path: Path) -> None:
    """A worker runs its import path's sitecustomize.py as root before the sandbox: a world-writable entry, one
    inside a world-writable folder without the sticky bit (it can be renamed away and replaced), or one that does not
    exist yet, is left out."""
    loose, sticky, open_parent, kept = tmp_path / "loose", tmp_path / "sticky", tmp_path / "open", tmp_path / "kept"
    missing = tmp_path / "not-there-yet"  # whoever creates it decides what it holds
    for folder, mode in ((loose, 0o777), (sticky, 0o1777), (open_parent, 0o777), (kept, 0o755)):
        folder.mkdir()
        folder.chmod(mode)
    (sticky / "site").mkdir(mode=0o755)
    (open_parent / "site").mkdir(mode=0o755)
    entries = [loose, sticky / "site", open_parent / "site", missing, kept]
    env = child_env(tmp_path, build_jobs=2, threads=1, source={"PYTHONPATH": ":".join(map(str, entries))})
    assert env["PYTHONPATH"].split(":") == [str(REPO), str(sticky / "site"), str(kept)]


def test_a_jobs_processes_are_its_root_and_every_descendant() -> None:
    """One scan of /proc finds a process tree as psutil's tree walk does (a grandchild included), and nothing else."""
    shell = subprocess.Popen(["sh", "-c", "sleep 30 & (sleep 30 & wait) & wait"])
    try:
        deadline = time.monotonic() + 10
        while len(psutil.Process(shell.pid).children(recursive=True)) < 3 and time.monotonic() < deadline:
            time.sleep(0.05)
        expected = {shell.pid, *(child.pid for child in psutil.Process(shell.pid).children(recursive=True))}
        assert len(expected) == 4
        assert set(job_pids(None, [shell.pid])) == expected
        assert job_pids(None, [2**22 + 1]) == []  # no such process
    finally:
        for pid in job_pids(None, [shell.pid]):
            os.kill(pid, signal.SIGKILL)
        shell.wait()


def test_child_environment_drops_secrets(tmp_path: Path) -> None:
    env = child_env(
        tmp_path,
        build_jobs=2,
        threads=1,
        source={
            "PATH": "/usr/bin",
            "OPENAI_API_KEY": "sk-1",
            "TORCH_TOKEN": "t",
            "HF_TOKEN": "h",
            "AWS_SECRET_ACCESS_KEY": "a",
            "TORCH_CUDA_ARCH_LIST": "9.0",
            "DB_PASSWORD": "p",
            "HOME": "/root",
            "TORCH_EXTENSIONS_DIR": "/shared",
        },
    )
    assert env["PATH"] == "/usr/bin" and env["TORCH_CUDA_ARCH_LIST"] == "9.0"
    assert not {"OPENAI_API_KEY", "TORCH_TOKEN", "HF_TOKEN", "AWS_SECRET_ACCESS_KEY", "DB_PASSWORD"} & set(env)
    assert env["HOME"] == env["TMPDIR"] == str(tmp_path)
    assert env["TORCH_EXTENSIONS_DIR"].startswith(str(tmp_path))


def test_writes_outside_private_dir_fail(
    client: httpx.Client, tmp_path: Path, build_cache_dir: Path, strict_only: None
) -> None:
    targets = [str(tmp_path / "outside.txt"), str(REPO / "pwned.txt"), str(build_cache_dir / "pwned.txt"), "/pwned.txt"]
    result = evaluate_briefly(client, sources.write_outside(targets))
    assert "WRITES" in result["message"], result["message"]
    for target in targets:
        assert not Path(target).exists(), f"{target} was written by a candidate"
    # /tmp is a private tmpfs in the sandbox: the write "succeeds" there but never reaches the host's /tmp.
    assert "PermissionError" in result["message"] or "OSError" in result["message"]
    evaluate_ok(client)


def test_network_is_unreachable(client: httpx.Client, evaluator_url: str, strict_only: None) -> None:
    port = urlparse(evaluator_url).port
    result = evaluate_briefly(client, sources.NETWORK.replace("PORT", str(port)))
    assert "NETWORK" in result["message"], result["message"]
    assert "NETWORK connected" not in result["message"]
    evaluate_ok(client)


def test_reference_outputs_are_out_of_reach(client: httpx.Client, strict_only: None) -> None:
    result = evaluate_briefly(client, sources.FIND_REFERENCE_OUTPUTS)
    assert "FOUND []" in result["message"], result["message"]


def test_fork_bomb_is_contained(client: httpx.Client, strict_only: None) -> None:
    result = evaluate_briefly(client, sources.FORK_BOMB, timeout_s=30)
    assert result["status"] in ("runtime_error", "timeout", "crashed"), result["message"]
    if result["status"] == "runtime_error":
        assert "fork refused" in result["message"]
    deadline = time.monotonic() + 10
    while len(sandbox_processes()) > 2 * WORKERS and time.monotonic() < deadline:
        time.sleep(0.2)
    # What is left are the idle pre-spawned workers, never the forked children.
    assert len(sandbox_processes()) <= 2 * WORKERS
    evaluate_ok(client)


# Stands in for an init that never reaps: the child subreaper of the server it starts, it waits for the server
# alone, then writes the zombies its children left (pid, real uid) to argv[1]. The group's SIGTERM is the server's.
NON_REAPING_INIT = """
import ctypes, json, os, signal, subprocess, sys, time
ctypes.CDLL(None).prctl(36, 1, 0, 0, 0)
server = subprocess.Popen(sys.argv[2:])
signal.signal(signal.SIGTERM, signal.SIG_IGN)
code = server.wait()
time.sleep(1)
zombies = []
for task in os.listdir("/proc/self/task"):
    for pid in open(f"/proc/self/task/{task}/children").read().split():
        status = open(f"/proc/{pid}/status").read()
        if "State:\tZ" in status:
            zombies.append((int(pid), int(status.split("Uid:")[1].split()[0])))
with open(sys.argv[1], "w") as report:
    json.dump(zombies, report)
sys.exit(code)
"""


def test_the_service_reaps_its_killed_workers(tmp_path: Path, strict_only: None) -> None:
    """Killing a worker kills its relay and pid 1 of its namespace together; pid 1, orphaned, comes to the service,
    which reaps it, rather than to an init that may not (a CI container's did not: a zombie per job, each counted
    against its uid's process limit, failed the fork-bomb test above). The server runs under a stand-in for such an
    init, which reports what was left to it, at shutdown too."""
    report = tmp_path / "zombies.json"
    base = sandbox_uid_base() + 3600
    env = server_env(tmp_path / "cache", EVALUATOR_SANDBOX_UID_BASE=str(base))
    prefix = [sys.executable, "-c", NON_REAPING_INIT, str(report)]
    with run_service("evaluator", env=env, prefix=prefix) as url, httpx.Client(base_url=url, timeout=600) as http:
        for candidate, status in ((sources.CORRECT, "correct"), (sources.INFINITE_LOOP, "timeout")):
            result = evaluate_briefly(http, candidate, timeout_s=20)
            assert result["status"] == status, result["message"]
    left = json.loads(report.read_text())
    assert not [pid for pid, uid in left if base <= uid < base + uid_count(WORKERS)], left


def evaluate_ok(client: httpx.Client) -> None:
    result = evaluate_briefly(client, sources.CORRECT)
    assert result["status"] == "correct", result["message"]


@pytest.mark.parametrize("reference", [sources.REFERENCE_WITH_WEIGHTS])
def test_same_seed_gives_same_random_weights(client: httpx.Client, reference: str) -> None:
    result = evaluate_briefly(client, sources.LINEAR_CORRECT, reference=reference, seed=None)
    assert result["status"] == "correct", result["message"]
    assert isinstance(result["seed"], int)


def test_a_thread_waiting_in_the_kernel_at_a_stop_may_only_stop_after() -> None:
    """A stop takes a thread still waiting in the kernel after STOP_WAITING_S for stopped (a vfork parent never
    leaves that wait while its child is stopped). Its stop is then only pending, and a SIGCONT undoes it: once its wait
    ends it runs on (a red-team helper in long writes escaped so). The check of a held job lets such a thread end its
    wait and stop, and nothing else. Read here from a real process, as a stop of it that found it in state D."""
    job = subprocess.Popen([sys.executable, "-c", "import time\nwhile True: time.sleep(0.01)"])
    try:
        time.sleep(0.3)
        (tid, now), *_ = _thread_marks([job.pid])[0].items()
        in_the_kernel = JobStop([job.pid], {tid: ThreadMark(b"D", False, now.switches)})
        assert "ran" in ran_since_stop(in_the_kernel)  # it runs: sleeping and waking, never stopped
        stopped = stop_job(None, job.pid)
        assert stopped.marks[tid].state == b"T"
        assert ran_since_stop(in_the_kernel) == ""  # it ended its wait and stopped
        assert ran_since_stop(stopped) == ""
        os.kill(job.pid, signal.SIGCONT)
        time.sleep(0.1)
        ran = ran_since_stop(stopped)
        # The message says which part of the thread's mark moved, beside its states at the stop and now.
        assert "ran" in ran and f"{tid} T>" in ran and "switches (" in ran, ran
    finally:
        job.kill()
        job.wait()


def test_a_thread_whose_wait_in_the_kernel_ends_during_the_check_is_let_stop(monkeypatch: pytest.MonkeyPatch) -> None:
    """A thread waiting in the kernel at the stop whose wait ends late runs in the kernel on its way to its stop
    (the rest of a munmap that waited for the address space's lock): the check waits for it to stop rather than take
    it, runnable, for a job resumed behind the judge's back (a CI run flagged an honest candidate so). One that does
    not stop is caught. Read here from a real process that runs, as a stop of it that found it in state D."""
    job = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        time.sleep(0.3)
        (tid, now), *_ = _thread_marks([job.pid])[0].items()
        assert now.state == b"R"
        in_the_kernel = JobStop([job.pid], {tid: ThreadMark(b"D", False, now.switches)})
        stopping = threading.Timer(0.2, os.kill, (job.pid, signal.SIGSTOP))
        stopping.start()
        started = time.monotonic()
        assert ran_since_stop(in_the_kernel) == ""
        assert time.monotonic() - started >= 0.15
        os.kill(job.pid, signal.SIGCONT)
        time.sleep(0.1)
        monkeypatch.setattr(sandbox, "STOP_SETTLE_S", 0.3)
        assert "ran on" in ran_since_stop(in_the_kernel)
    finally:
        job.kill()
        job.wait()


# A session leader (with a pseudo-terminal as its controlling terminal when argv[1] is "terminal") parked in vfork:
# it waits in the kernel (state D) while its child, stopped, never execs.
VFORK_PARKED = r"""
#define _GNU_SOURCE
#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
int main(int argc, char **argv) {
    setsid();
    if (argc > 1 && strcmp(argv[1], "terminal") == 0) {
        int master = posix_openpt(O_RDWR);
        if (master < 0 || grantpt(master) || unlockpt(master) || open(ptsname(master), O_RDWR) < 0) return 1;
    }
    if (vfork() == 0) {
        kill(getpid(), SIGSTOP);
        _exit(0);
    }
    return 0;
}
"""


@pytest.mark.parametrize("terminal", [False, True])
def test_a_thread_waiting_in_the_kernel_never_counts_as_stopped_where_a_terminal_controls_it(
    tmp_path: Path, terminal: bool
) -> None:
    """A stop takes a thread still waiting in the kernel after STOP_WAITING_S for stopped, but not one whose process
    has a controlling terminal: the terminal's hangup, which the end of a call can cause, sends it SIGCONT (a red-team
    helper ran while held so, unflagged). Read from a real vfork parent, with and without a pseudo-terminal."""
    binary = tmp_path / "vfork_parked"
    subprocess.run(["cc", "-x", "c", "-o", str(binary), "-"], input=VFORK_PARKED, text=True, check=True)
    job = subprocess.Popen([str(binary), "terminal" if terminal else "none"])
    try:
        deadline = time.monotonic() + 10
        while (marks := _thread_marks([job.pid])[0]).get(job.pid, ThreadMark(b"R", False, ())).state != b"D":
            assert job.poll() is None and time.monotonic() < deadline, "the job never waited in vfork"
            time.sleep(0.01)
        assert marks[job.pid].has_terminal == terminal
        with open(f"/proc/{job.pid}/task/{job.pid}/children") as handle:
            (child,) = (int(pid) for pid in handle.read().split())
        settled = _stop_marks([job.pid, child], waiting_settled=True)
        assert (settled is None) == terminal, settled
    finally:
        os.killpg(job.pid, signal.SIGKILL)
        job.wait()


# Starts a child that burns 30 ms of CPU, waits for it, and again.
REAPS_CHILDREN = """
import os, time
while True:
    child = os.fork()
    if child == 0:
        end = time.process_time() + 0.03
        while time.process_time() < end:
            pass
        os._exit(0)
    os.waitpid(child, 0)
"""


def test_a_thread_waiting_in_the_kernel_at_a_stop_that_then_reaps_a_child_is_caught() -> None:
    """A thread that ended its wait in the kernel after the stop may stop then, but not start a child and wait for
    it first: in `process` isolation the child's CPU time leaves with it (a red-team helper so ran a 60 ms child
    while its job was held, and stopped itself again before the check). Read here from a real process, as a stop
    of it that found it in state D."""
    job = subprocess.Popen([sys.executable, "-c", REAPS_CHILDREN], start_new_session=True)
    try:
        time.sleep(0.3)
        (tid, before), *_ = _thread_marks([job.pid])[0].items()
        time.sleep(0.3)  # about ten children
        stopped = stop_job(None, job.pid)
        assert stopped.marks[tid].state == b"T"
        assert stopped.marks[tid].reaped_ticks > before.reaped_ticks
        in_the_kernel = JobStop(stopped.pids, {tid: before._replace(state=b"D")})
        assert "ran" in ran_since_stop(in_the_kernel)
        waited_only = JobStop(stopped.pids, {tid: stopped.marks[tid]._replace(state=b"D")})
        assert ran_since_stop(waited_only) == ""
    finally:
        os.killpg(job.pid, signal.SIGKILL)  # the child the stop found too, else left stopped for good
        job.wait()


def test_a_thread_that_had_exited_at_a_stop_may_be_gone_after() -> None:
    """A stop takes a thread that has exited (a zombie, or dead) for settled; the kernel then releases it, and its
    tid leaves /proc, with nothing of the job running. The check of a held job lets it go: a worker's threads (torch's,
    Python's) may end at any time, and an honest job would be taken for one resumed behind the judge's back."""
    job = subprocess.Popen([sys.executable, "-c", "import time\nwhile True: time.sleep(0.01)"])
    try:
        time.sleep(0.3)
        stopped = stop_job(None, job.pid)
        gone = -1  # no thread has this id: one the kernel has released since the stop
        exited = JobStop(stopped.pids, {**stopped.marks, gone: ThreadMark(b"Z", False, (3, 1))})
        assert ran_since_stop(exited) == ""
        still_there = JobStop(stopped.pids, {**stopped.marks, gone: ThreadMark(b"T", False, (3, 1))})
        assert "ran" in ran_since_stop(still_there)
    finally:
        job.kill()
        job.wait()
