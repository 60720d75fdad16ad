"""Worker process: runs one job (reference, candidate, timer or build), then exits. Started by `pool.py`, never reused.

The worker trusts nothing it is sent beyond the job's role and obeys the service's commands; the service
trusts nothing the worker says (docs/evaluator.md, "Threat model"). Events go on a pipe of our own, JSON lines;
stdout and stderr belong to the job's code.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import traceback
from typing import Any

from services.evaluator import sandbox


class Events:
    """JSON lines to the service on a pipe of our own; stdout and stderr belong to the job's code."""

    def __init__(self, fd: int) -> None:
        self.fd = fd

    def emit(self, event: str, **fields: Any) -> None:
        data = (json.dumps({"event": event, **fields}, default=str) + "\n").encode()
        while data:
            data = data[os.write(self.fd, data) :]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spec", required=True, help="SandboxSpec as JSON")
    parser.add_argument("--events-fd", type=int, required=True)
    parser.add_argument("--device", required=True)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--cache-dir", required=True)
    parser.add_argument("--handover-fd", type=int, help="socket for checked outputs in GPU memory (device_handover)")
    args = parser.parse_args()
    sandbox.enter(sandbox.SandboxSpec.from_arg(args.spec))
    # Ignored until the worker becomes a candidate (runner.run_candidate): in process isolation any job may send
    # it, and Python would raise KeyboardInterrupt whenever the worker next ran, in the reference's run or timer
    # of another evaluation (a red-team job broke its own timer this way, and the next evaluation's reference).
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    events = Events(args.events_fd)
    try:
        # Imported only now: torch and the candidate-facing code load under the sandbox's limits.
        from services.evaluator import runner

        context = runner.WorkerContext.start(
            args.device, args.threads, args.cache_dir, events.emit, sys.stdin, args.handover_fd
        )
    except BaseException:
        events.emit("error", stage="startup", message=traceback.format_exc())
        os._exit(3)
    events.emit(
        "ready",
        device_hash_unavailable=context.device_hash_unavailable,
        device_memory_bytes=context.device_memory_bytes,
    )
    job = json.loads(sys.stdin.readline())
    try:
        runner.run_job(context, job)
    except BaseException:
        events.emit("error", stage="worker", message=traceback.format_exc())
    sys.stdout.flush()
    sys.stderr.flush()
    # Skip atexit handlers and non-daemon threads the job may have left behind.
    os._exit(0)


if __name__ == "__main__":
    main()
