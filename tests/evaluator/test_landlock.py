"""Each worker's Landlock domain (landlock.py), entered in a child process of the test's (a domain cannot be left):
what it keeps the job from, and what it must leave a job free to do."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from services.evaluator import landlock
from tests.servers import REPO

# In a domain of the given version's kind: moves a file into another directory, connects to a TCP port listening
# on loopback and binds one, opens the memory of a child it started itself and of an outside process, signals both,
# and prints what worked.
IN_A_DOMAIN = textwrap.dedent(
    """
    import ctypes, os, socket, subprocess, sys, tempfile
    from services.evaluator import landlock

    outside = int(sys.argv[2])
    ctypes.CDLL(None, use_errno=True).prctl(38, 1, 0, 0, 0)  # PR_SET_NO_NEW_PRIVS
    listener = socket.create_server(("127.0.0.1", 0))  # bound before the domain is entered
    print("version", landlock.restrict_self(int(sys.argv[1])))
    inside = subprocess.Popen(["sleep", "60"])

    def worked(what, attempt):
        try:
            attempt()
            print(what, "ok")
        except OSError as error:
            print(what, error.errno)

    with tempfile.TemporaryDirectory() as home:
        os.mkdir(f"{home}/a")
        os.mkdir(f"{home}/b")
        open(f"{home}/a/file", "w").close()
        worked("rename", lambda: os.rename(f"{home}/a/file", f"{home}/b/file"))
    worked("tcp connect", lambda: socket.create_connection(listener.getsockname(), timeout=5).close())
    worked("tcp bind", lambda: socket.create_server(("127.0.0.1", 0)).close())
    for name, pid in (("inside", inside.pid), ("outside", outside)):
        worked(f"{name} mem", lambda: os.close(os.open(f"/proc/{pid}/mem", os.O_RDONLY)))
        worked(f"{name} signal", lambda: os.kill(pid, 0))
    inside.kill()
    """
)


def run_in_a_domain(version: int) -> dict[str, str]:
    outside = subprocess.Popen(["sleep", "60"])
    try:
        done = subprocess.run(
            [sys.executable, "-c", IN_A_DOMAIN, str(version), str(outside.pid)],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        )
    finally:
        outside.kill()
        outside.wait()
    return dict(line.rsplit(" ", 1) for line in done.stdout.splitlines())


@pytest.mark.parametrize("version", [landlock.REFER_ABI, landlock.TCP_ABI, landlock.SCOPES_ABI])
def test_a_domain_keeps_its_processes_from_the_outside_and_lets_them_move_files(version: int) -> None:
    """Each kind of domain a kernel may give (landlock.restrict_self), on this kernel."""
    if landlock.abi() < version:
        pytest.skip(f"this kernel's Landlock ABI is {landlock.abi()}")
    seen = run_in_a_domain(version)
    assert seen["version"] == str(version)
    assert seen["rename"] == "ok", "a file moved into another directory (EXDEV: REFER not granted)"
    assert seen["inside mem"] == "ok" and seen["inside signal"] == "ok", seen
    assert seen["outside mem"] != "ok", seen
    tcp = seen["tcp connect"], seen["tcp bind"]
    assert tcp == (("ok", "ok") if version < landlock.TCP_ABI else ("13", "13")), seen  # EACCES
    assert (seen["outside signal"] == "ok") == (version < landlock.SCOPES_ABI), seen
