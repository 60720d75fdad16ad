"""Worker process: runs one reference or one candidate job, then exits. Started by `pool.py`, never reused.

Threat model. The candidate (and the reference) are arbitrary Python, possibly written to fool the reward.

Covered:
- Crashes and faults (segfault, abort, `os._exit`, illegal memory access) end this process only; the service
  sees the signal or exit code and answers `crashed`. The next job gets a fresh process.
- Endless loops and sleeps: the service kills the whole process group (and, in strict isolation, every process
  of the job's uid) at the wall-clock limit and answers `timeout`.
- Memory: RLIMIT_AS on CPU workers turns a huge allocation into an exception (`runtime_error`); a watchdog of
  the job's resident memory (the only memory limit of CUDA workers) kills a job over the limit (`crashed`).
- Fork loops: RLIMIT_NPROC on the job's own uid (strict isolation) bounds them; all its processes are killed.
- Secrets: the environment is an allow-list without credentials; in strict isolation the worker runs as an
  unprivileged uid, so it cannot read the service's `/proc/<pid>/environ` or root-only files.
- Network: in strict isolation the worker has its own empty network namespace (no interface but a down `lo`).
- Files: cwd, HOME and TMPDIR are a private directory. In strict isolation writes elsewhere fail (uid), /tmp,
  /var/tmp and /dev/shm are empty private tmpfs mounts, and unreadable parents such as /root are hidden except for
  the interpreter, the repository and the (read-only) build cache.
- Reference outputs: computed in a separate reference process; the candidate process never sees them.
  Candidate outputs go to files that the service loads with `torch.load(weights_only=True)` and compares, so a
  candidate cannot patch the comparison. The reference module is only loaded in the candidate process after
  the outputs were written (for timing), so it cannot be called to produce them.
- Monkeypatching: callables of torch, torch.Tensor, torch.nn.functional, time, builtins and of our own worker
  modules are snapshotted before candidate code is imported; replacing any is flagged `monkeypatch`.
- Build cache: candidates build into their private directory; only the service publishes into the cache, after
  checking the files still have the digests reported at build time.

Not covered:
- Timing numbers are measured inside the candidate process. A candidate that deliberately forges its result
  message can report false timings; the service rejects reports that claim more measured time than elapsed
  (`implausible_timing`) and more than one result (`result_tampering`), nothing more.
- `process` isolation (no root): no uid change, no network namespace, no NPROC limit; a process that escapes the
  process group (setsid) can outlive the job, and the candidate can read whatever the service's user can.
- Side channels, CPU contention between concurrent jobs, kernel exploits, and disk filling of the private
  directory (files are limited by RLIMIT_FSIZE, not their number).
"""

from __future__ import annotations

import argparse
import json
import os
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
    args = parser.parse_args()
    sandbox.enter(sandbox.SandboxSpec.from_arg(args.spec))
    events = Events(args.events_fd)
    try:
        # Imported only now: torch and the candidate-facing code load under the sandbox's limits.
        from services.evaluator import runner

        context = runner.WorkerContext.start(args.device, args.threads, args.cache_dir, events.emit)
    except BaseException:
        events.emit("error", stage="startup", message=traceback.format_exc())
        os._exit(3)
    events.emit("ready")
    job = json.loads(sys.stdin.readline())
    try:
        runner.run_job(context, job, sys.stdin)
    except BaseException:
        events.emit("error", stage="worker", message=traceback.format_exc())
    sys.stdout.flush()
    sys.stderr.flush()
    # Skip atexit handlers and non-daemon threads the job may have left behind.
    os._exit(0)


if __name__ == "__main__":
    main()
