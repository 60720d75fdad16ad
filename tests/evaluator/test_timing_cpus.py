"""The judge's timing core: which core each GPU's timed workers are pinned to, and a worker pinning its threads there
and keeping its launching thread there whatever the candidate does with its affinity (runner.WorkerContext)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from services.evaluator.pool import timing_cpus

ALLOWED = sorted(os.sched_getaffinity(0))
needs_two_cores = pytest.mark.skipif(len(ALLOWED) < 2, reason="pinning one core of one is no test")


def test_each_gpu_gets_one_of_the_last_allowed_cores_by_default() -> None:
    chosen = timing_cpus(None, ["0", "1"])
    assert chosen["0"] == ALLOWED[-1]
    assert chosen["1"] == ALLOWED[-2 % len(ALLOWED)]


def test_named_cores_go_to_the_gpus_in_order_and_none_means_no_pinning() -> None:
    assert timing_cpus([ALLOWED[0]], ["0", "1"]) == {"0": ALLOWED[0], "1": ALLOWED[0]}
    assert timing_cpus([], ["0"]) == {}


def test_a_core_the_service_may_not_run_on_fails_at_start() -> None:
    with pytest.raises(ValueError, match="may not run on"):
        timing_cpus([max(ALLOWED) + 1], ["0"])


# A worker's context in a process of its own (pinning reaches every thread of the process), with a thread started
# before the judge names a core; prints each thread's cores after a timing command, after the candidate's code
# moved the launching thread and the next call put it back, and after a later command that names no core.
WORKER = """
import io, json, os, sys, threading
from pathlib import Path
import torch
from services.evaluator.backends import get_backend
from services.evaluator.runner import WorkerContext

commands = [json.loads(arg) for arg in sys.argv[1:]]
control = io.StringIO("".join(json.dumps(c) + "\\n" for c in commands))
context = WorkerContext(get_backend("cpu"), Path("."), Path("."), torch.get_num_threads(), print, control)
stop = threading.Event()
helper = threading.Thread(target=stop.wait)
helper.start()
cores = lambda tid=0: sorted(os.sched_getaffinity(tid))
seen = {}
context.command()
seen["threads"] = [cores(int(tid)) for tid in os.listdir("/proc/self/task")]
os.sched_setaffinity(0, range(os.cpu_count()))
seen["moved"] = cores()
context.pin_threads()
seen["call"] = cores()
if len(commands) > 1:
    context.command()
    seen["later"] = cores()
stop.set()
print(json.dumps(seen))
"""


def worker_affinities(*commands: dict[str, object]) -> dict[str, list[list[int]] | list[int]]:
    done = subprocess.run(
        [sys.executable, "-c", WORKER, *(json.dumps(c) for c in commands)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=Path(__file__).resolve().parents[2],
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


@needs_two_cores
def test_a_timing_command_pins_every_thread_and_every_call_puts_the_launching_thread_back() -> None:
    core = ALLOWED[-1]
    seen = worker_affinities({"op": "draw", "cpu": core}, {"op": "block"})
    assert len(seen["threads"]) >= 2 and all(cores == [core] for cores in seen["threads"])
    assert seen["moved"] == ALLOWED  # what a candidate's code may do between two calls
    assert seen["call"] == seen["later"] == [core]


@needs_two_cores
def test_a_worker_never_told_a_core_is_not_pinned() -> None:
    seen = worker_affinities({"op": "draw"})
    assert all(cores == ALLOWED for cores in seen["threads"]) and seen["call"] == ALLOWED
