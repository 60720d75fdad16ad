"""What a job can reach of the evaluator's other workers, in both isolation levels, against the real servers. In
`process` isolation every job runs under the service's uid, so the reference's workers are protected by what the
kernel gives a process against its own uid: they are not dumpable (no /proc/<pid>/fd, mem or ptrace), they read
nothing from a file a job could change, and whatever a job does to the timer is that job's verdict."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from tests.evaluator import sources
from tests.evaluator.conftest import evaluate, process_server

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
    makes it raise KeyboardInterrupt and report an error of its own), then answers wrong: never `evaluator_error`,
    which carries no penalty."""
    return sources.candidate(
        f"""
CALLS.append(1)
if len(CALLS) == 4:
    signal_the_others(signal.{signum})
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


@pytest.mark.parametrize("signum", ["SIGKILL", "SIGINT"])
def test_a_job_that_breaks_its_timer_gets_a_verdict_of_its_own(any_client: httpx.Client, signum: str) -> None:
    """SIGKILL in process isolation kills the timer: the candidate's `result_tampering`. SIGINT, which made the timer
    raise KeyboardInterrupt (and the next evaluation's reference, in an idle worker), is ignored by every worker but
    a candidate's. Strict isolation: no other worker is visible; the zeros are wrong."""
    result = evaluate(any_client, breaks_its_timer(signum), correctness_trials=3)
    if signum == "SIGKILL" and any_client.get("/health").json()["details"]["isolation"] == "process":
        assert result["status"] == "rejected" and "result_tampering" in result["flags"], result
        assert "any job can reach it" in result["message"], result["message"]
    else:
        assert result["status"] in ("incorrect", "rejected"), result
    after = evaluate(any_client, sources.CORRECT)
    assert after["status"] == "correct", after["message"]


# Makes a directory where each idle worker will write the reference's source: the one that becomes its timer
# fails with an error of its own. It also breaks later evaluations on the server, so it gets a server of its own.
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


def test_a_timer_that_fails_with_an_error_in_process_isolation_is_the_candidates(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    with process_server(tmp_path_factory.mktemp("evaluator-planted") / "server.log") as (client, _):
        result = evaluate(client, PLANTS_IN_THE_IDLE_WORKERS)
    assert result["status"] == "rejected" and "result_tampering" in result["flags"], result
    assert "IsADirectoryError" in result["message"] and "any job can reach it" in result["message"], result


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
