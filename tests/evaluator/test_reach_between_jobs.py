"""What a job can reach of the evaluator's other workers, in both isolation levels, against the real servers. In
`process` isolation every job runs under the service's uid, so the reference's workers are protected by what the
kernel gives a process against its own uid: they are not dumpable (no /proc/<pid>/fd, mem or ptrace), they read
nothing from a file a job could change, and whatever a job does to the timer is that job's verdict."""

from __future__ import annotations

from pathlib import Path

import httpx

from tests.evaluator import sources
from tests.evaluator.conftest import evaluate

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

# Kills them once its timing has begun (the reference's timer among them), then answers wrong: never
# `evaluator_error`, which carries no penalty.
KILLS_ITS_TIMER = sources.candidate(
    """
CALLS.append(1)
if len(CALLS) == 4:
    signal_the_others(signal.SIGKILL)
return x.clamp_min(0) * self.scale if len(CALLS) < 4 else torch.zeros_like(x)
""",
    prelude=SIGNALS_THE_OTHERS + "CALLS = []",
)

# Stops them at import (the idle workers later evaluations take).
STOPS_THE_IDLE_WORKERS = sources.candidate(
    "return x.clamp_min(0) * self.scale", prelude=SIGNALS_THE_OTHERS + "signal_the_others(signal.SIGSTOP)"
)


def test_a_job_cannot_open_the_pipes_or_memory_of_other_workers(any_client: httpx.Client) -> None:
    result = evaluate(any_client, OPENS_OTHER_WORKERS_PIPES)
    assert result["status"] == "correct", result["message"]


def test_a_job_that_kills_its_timer_gets_a_verdict_of_its_own(any_client: httpx.Client) -> None:
    result = evaluate(any_client, KILLS_ITS_TIMER, correctness_trials=3)
    if any_client.get("/health").json()["details"]["isolation"] == "process":
        assert result["status"] == "rejected" and "result_tampering" in result["flags"], result
        assert "any job can reach it" in result["message"], result["message"]
    else:  # its own pid namespace: nothing to kill; its zeros are wrong
        assert result["status"] in ("incorrect", "rejected"), result
    assert evaluate(any_client, sources.CORRECT)["status"] == "correct"


def test_process_isolation_removes_every_finished_workers_directory(
    process_client: httpx.Client, process_home: Path
) -> None:
    """The service, not root there, could not empty the read-only inputs directory it hands over: every worker's
    directory (and on the `files` path every input set) was left behind."""
    for seed in range(3):
        result = evaluate(process_client, sources.CORRECT, seed=seed)
        assert result["status"] == "correct", result["message"]
    left = [path for path in process_home.glob("kernel-agent-evaluator-*/w*") if path.is_dir()]
    # The idle workers (two per slot) and at most one being replaced.
    assert len(left) <= 2 * 2 + 1, left


def test_workers_a_job_stopped_or_killed_are_not_handed_to_the_next(any_client: httpx.Client) -> None:
    """In process isolation a job can signal the idle workers: a later evaluation gets one resumed, or a fresh one
    for one that was killed (it got `evaluator_error`, the reference's run or timer never answering)."""
    assert evaluate(any_client, STOPS_THE_IDLE_WORKERS)["status"] == "correct"
    for seed in range(3):
        result = evaluate(any_client, sources.CORRECT, seed=seed)
        assert result["status"] == "correct", result["message"]
