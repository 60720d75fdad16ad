"""Helper process of a strict-isolation service: sends a signal to every process of one job uid at once.

Stopping or killing a job by scanning /proc and signalling what the scan found misses a process that keeps
forking (each parent exiting): its new pid did not exist when the scan listed them. `kill(-1, signum)` does not:
the kernel signals every process the sender may signal in one pass over its task list, and a fork in progress
passes a signal sent that way on to the child.

Who may be signalled is decided by uids: the sender's real or effective uid must equal the target's real or saved
uid. For each request this process takes real uid `sender` (a uid no process holds), effective uid the job's and
saved uid 0, so the signal reaches exactly that job's processes (no job can change its uid), and no job process may
signal this one (its uids match neither). It takes root back after each request through the saved uid 0.

Run by the service with `python -I -S <this file> <sender uid>`: no import beyond the standard library's. Requests
on stdin, one per line, `<signum> <uid>`; the answer is `ok` once the signal is sent. Exits at EOF: the service
is gone or done.
"""

from __future__ import annotations

import os
import signal
import sys

# Stop, resume and kill are what the service sends; anything else is a bug on its side.
ALLOWED_SIGNALS = {signal.SIGSTOP, signal.SIGCONT, signal.SIGKILL}


def main() -> None:
    sender = int(sys.argv[1])
    for line in sys.stdin.buffer:
        signum, uid = (int(value) for value in line.split())
        if signum not in ALLOWED_SIGNALS or uid < 1000 or uid == sender:
            sys.exit(f"refused request {line!r}")
        os.setresuid(sender, uid, 0)
        try:
            os.kill(-1, signum)
        except ProcessLookupError:
            pass  # no process of that uid
        finally:
            # Unprivileged now (the effective uid is not 0): allowed, since 0 is the saved uid; it restores the
            # effective capabilities. If it failed this process could not be trusted with another request.
            try:
                os.setresuid(0, 0, 0)
            except OSError:
                os._exit(70)
        sys.stdout.write("ok\n")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
