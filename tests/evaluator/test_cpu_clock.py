"""The judge's CPU clock of a job, with real processes: a helper that burned CPU before a block and exits in it must
not shorten the block's clock (a sum of the processes' totals subtracted what it had used), and a job's cgroup keeps
the time of a helper that exits."""

from __future__ import annotations

import subprocess
import sys
import time
import types

import pytest

from services.evaluator.evaluation import _cpu_clocks, _cpu_used_s, _jobs_clocks
from services.evaluator.job_cgroup import JobCgroups

BURN = (
    "import time\nend = time.process_time() + float(__import__('sys').argv[1])\nwhile time.process_time() < end: pass\n"
)


def test_a_process_that_exits_in_a_block_takes_only_its_own_share_away() -> None:
    helper = subprocess.Popen([sys.executable, "-c", BURN + "import time; time.sleep(60)", "0.6"])
    worker = subprocess.Popen(
        [sys.executable, "-c", "import sys; sys.stdin.read(1)\n" + BURN, "0.3"], stdin=subprocess.PIPE
    )
    try:
        while _cpu_clocks([helper.pid]).get(helper.pid, 0.0) < 0.55:  # the helper has banked its CPU time
            time.sleep(0.05)
        before = _cpu_clocks([helper.pid, worker.pid])
        assert worker.stdin is not None
        worker.stdin.write(b"x")
        worker.stdin.flush()  # the block: the worker burns 0.3 s while the helper exits
        helper.kill()
        helper.wait()
        deadline = time.monotonic() + 30
        while (
            _cpu_clocks([worker.pid]).get(worker.pid, 0.0) - before[worker.pid] < 0.29 and time.monotonic() < deadline
        ):
            time.sleep(0.02)
        after = _cpu_clocks([helper.pid, worker.pid])
        assert helper.pid not in after
        assert _cpu_used_s(before, after) >= 0.29  # the worker's 0.3 s, not 0.3 - 0.6
    finally:
        for proc in (helper, worker):
            proc.kill()
            proc.wait()


# Joins the cgroup(s) named on its command line, then on a byte from stdin forks a helper that burns 0.4 s of CPU
# and exits, and says "done" once it has.
JOB_WITH_EXITING_HELPER = """
import os, sys, time
for procs in sys.argv[1:]:
    with open(procs, "w") as handle:
        handle.write(str(os.getpid()))
sys.stdin.read(1)
if os.fork() == 0:
    end = time.process_time() + 0.4
    while time.process_time() < end:
        pass
    os._exit(0)
os.wait()
print("done", flush=True)
sys.stdin.read(1)
"""


def test_a_jobs_cgroup_keeps_the_time_of_a_helper_that_exited() -> None:
    """Per-process clocks lose a helper's time when it exits; the job's cgroup (where the host gives one) keeps it:
    a job whose helper burns 0.4 s and exits inside a block shows those 0.4 s on the judge's clock."""
    cgroups = JobCgroups.create(memory_limit_mb=1024)
    if cgroups is None:
        pytest.skip("no cgroups here (needs root and a memory controller, or a delegated v2 subtree)")
    group = cgroups.make("cpu-clock-test")
    job = subprocess.Popen(
        [sys.executable, "-c", JOB_WITH_EXITING_HELPER, *group.procs_files],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    )
    worker = types.SimpleNamespace(proc=job, cgroup=group)
    try:
        time.sleep(1.0)  # the job has joined its group and waits
        assert job.pid in group.member_pids()
        before = _jobs_clocks([worker], [job.pid])  # type: ignore[list-item]
        per_process_before = _cpu_clocks([job.pid])
        assert job.stdin is not None and job.stdout is not None
        job.stdin.write(b"x")
        job.stdin.flush()
        assert job.stdout.readline() == b"done\n"  # the helper burned its time and exited
        after = _jobs_clocks([worker], [job.pid])  # type: ignore[list-item]
        assert _cpu_used_s(per_process_before, _cpu_clocks([job.pid])) < 0.2  # what per-process clocks see
        assert _cpu_used_s(before, after) >= 0.38
    finally:
        job.kill()
        job.wait()
        group.remove()
        cgroups.close()
