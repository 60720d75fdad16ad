"""Each worker's Landlock domain (landlock.py), entered in a child process of the test's (a domain cannot be left):
what it keeps the job from, and what it must leave a job free to do."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from services.evaluator import landlock
from tests.servers import REPO

# Prints whether `attempt` worked, or the errno it failed with; the scripts below run it in their domains.
REPORTS_WHAT_WORKED = textwrap.dedent(
    """
    def worked(what, attempt):
        try:
            attempt()
            print(what, "ok")
        except OSError as error:
            print(what, error.errno)
    """
)

# In a domain of the given version's kind: moves a file into another directory, connects to a TCP port listening
# on loopback and binds one, opens the memory of a child it started itself and of an outside process, signals both,
# and prints what worked.
IN_A_DOMAIN = REPORTS_WHAT_WORKED + textwrap.dedent(
    """
    import ctypes, os, socket, subprocess, sys, tempfile
    from services.evaluator import landlock

    outside = int(sys.argv[2])
    ctypes.CDLL(None, use_errno=True).prctl(38, 1, 0, 0, 0)  # PR_SET_NO_NEW_PRIVS
    listener = socket.create_server(("127.0.0.1", 0))  # bound before the domain is entered
    print("version", landlock.restrict_self(int(sys.argv[1])))
    inside = subprocess.Popen(["sleep", "60"])

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


def run_script(script: str, *args: str) -> dict[str, str]:
    """What `script` reports it did (REPORTS_WHAT_WORKED), given `args` and last the pid of a process outside its
    domain."""
    outside = subprocess.Popen(["sleep", "60"])
    try:
        done = subprocess.run(
            [sys.executable, "-c", script, *args, str(outside.pid)],
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
    seen = run_script(IN_A_DOMAIN, str(version))
    assert seen["version"] == str(version)
    assert seen["rename"] == "ok", "a file moved into another directory (EXDEV: REFER not granted)"
    assert seen["inside mem"] == "ok" and seen["inside signal"] == "ok", seen
    assert seen["outside mem"] != "ok", seen
    tcp = seen["tcp connect"], seen["tcp bind"]
    assert tcp == (("ok", "ok") if version < landlock.TCP_ABI else ("13", "13")), seen  # EACCES
    assert (seen["outside signal"] == "ok") == (version < landlock.SCOPES_ABI), seen


# In a domain that changes files only beneath the job's home (argv[1]) and reads nothing of the other jobs'
# (beneath argv[4], argv[5] holding another job's file and program) but beneath its home and a path it must read
# there (argv[6]), as a `process`-isolation worker's (a CUDA worker's where argv[3] is "cuda"): what it can do in its
# home, to a file and a directory outside it (argv[2]), in /dev, in /proc (its own threads' names as the CUDA driver
# writes them, and a file of a process of its uid outside the domain, argv[7]), and to the other job's and the
# readable path's files; prints what worked.
WRITING_IN_A_DOMAIN = REPORTS_WHAT_WORKED + textwrap.dedent(
    """
    import ctypes, os, socket, subprocess, sys, threading
    from services.evaluator import landlock

    home, outside, unreadable, other_job, readable, other = *sys.argv[1:3], *sys.argv[4:8]
    names_threads = sys.argv[3] == "cuda"
    ctypes.CDLL(None, use_errno=True).prctl(38, 1, 0, 0, 0)  # PR_SET_NO_NEW_PRIVS
    print("version", landlock.restrict_self(
        home=home, names_threads=names_threads, unreadable=unreadable, readable=(readable, unreadable)))

    def write(path, mode="w"):
        with open(path, mode) as handle:
            handle.write("written in a domain")

    os.makedirs(f"{home}/a/b")
    worked("home write", lambda: write(f"{home}/a/file"))
    worked("home rename", lambda: os.rename(f"{home}/a/file", f"{home}/a/b/file"))
    worked("home truncate", lambda: os.truncate(f"{home}/a/b/file", 0))
    worked("home remove", lambda: os.unlink(f"{home}/a/b/file"))
    worked("outside append", lambda: write(f"{outside}/file", "a"))
    worked("outside truncate", lambda: os.truncate(f"{outside}/file", 0))
    worked("outside create", lambda: write(f"{outside}/new"))
    worked("outside mkdir", lambda: os.mkdir(f"{outside}/dir"))
    worked("outside remove", lambda: os.unlink(f"{outside}/file"))
    worked("outside link", lambda: os.link(f"{outside}/file", f"{home}/link"))
    worked("outside symlink", lambda: os.symlink("/etc/passwd", f"{outside}/link"))
    worked("outside socket", lambda: socket.socket(socket.AF_UNIX).bind(f"{outside}/socket"))
    worked("move out", lambda: (write(f"{home}/moved"), os.rename(f"{home}/moved", f"{outside}/moved")))
    worked("outside read", lambda: open(f"{outside}/file").read())
    worked("home read", lambda: open(f"{home}/a/b/kept", "w").close() or open(f"{home}/a/b/kept").read())
    worked("home socket", lambda: socket.socket(socket.AF_UNIX).bind(f"{home}/socket"))
    worked("readable read", lambda: open(f"{readable}/file").read())
    worked("other job read", lambda: open(f"{other_job}/file").read())
    worked("other job list", lambda: os.listdir(other_job))
    worked("other job run", lambda: subprocess.run([f"{other_job}/program"], check=True))
    worked("dev null", lambda: write("/dev/null"))
    worked("dev shm create", lambda: write(f"/dev/shm/{os.path.basename(home)}-{os.getpid()}"))
    # As the CUDA driver names a thread it started: the thread opens its own comm to write and truncate.
    namer = threading.Thread(target=worked, args=("own thread name", lambda: write(
        f"/proc/self/task/{threading.get_native_id()}/comm")))
    namer.start()
    namer.join()
    worked("other process proc", lambda: write(f"/proc/{other}/oom_score_adj"))
    """
)


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_a_domain_with_write_rules_changes_files_only_beneath_its_home(tmp_path: Path, device: str) -> None:
    """A `process`-isolation worker's domain (sandbox.enter): the job's uid owns the build cache and other jobs'
    directories, which it may read (the build cache) or not even that (other jobs': a channel between candidates
    evaluated together) but no longer change; no socket file made, even in its home (another job could connect to
    it by its path); devices may be written, but nothing made in /dev (a file in /dev/shm would outlive the job); in
    /proc nothing, but a CUDA worker's own threads' files (their names: without, no CUDA)."""
    if landlock.abi() == 0:
        pytest.skip("this kernel gives workers no Landlock domain")
    jobs, outside = tmp_path / "jobs", tmp_path / "outside"
    home, other_job, readable = jobs / "w1" / "home", jobs / "w2" / "home", jobs / "cache"
    for directory in (home, other_job, readable, outside):
        directory.mkdir(parents=True)
    for directory in (outside, other_job, readable):
        (directory / "file").write_text("published")
    shutil.copy("/bin/true", other_job / "program")
    args = (str(home), str(outside), device, str(jobs), str(other_job), str(readable))
    seen = run_script(WRITING_IN_A_DOMAIN, *args)
    assert seen.pop("version") == str(landlock.abi())
    allowed = {
        "home write",
        "home rename",
        "home truncate",
        "home remove",
        "home read",
        "outside read",
        "readable read",
        "dev null",
        *(["own thread name"] if device == "cuda" else []),
    }
    assert {what for what, errno in seen.items() if errno == "ok"} == allowed, seen
    # EACCES; EXDEV for a link across the rules' boundary.
    assert {errno for what, errno in seen.items() if what not in allowed} <= {"13", "18"}, seen
    assert (outside / "file").read_text() == "published"
    assert sorted(path.name for path in outside.iterdir()) == ["file"]


def test_the_read_rules_grant_what_is_beside_the_workers_directories_and_only_that(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The rules for everything outside the directory the workers' are made in, down a path with a directory the
    service's uid may pass but not list (`locked`, as a 0711 directory is to another uid than its owner's): nothing
    beside it is granted but the paths the job must read (its interpreter there), and nothing that holds the
    workers' directories."""
    locked = tmp_path / "locked"
    jobs, interpreter, beside = locked / "jobs", locked / "venv", tmp_path / "beside"
    for directory in (jobs / "w1" / "home", interpreter, beside):
        directory.mkdir(parents=True)
    (tmp_path / "file").write_text("a file beside")
    (tmp_path / "link").symlink_to(jobs)
    listing = os.scandir

    def scandir(path: Path) -> Iterator[os.DirEntry[str]]:
        if Path(path) == locked:
            raise PermissionError(13, "Permission denied", str(path))
        return listing(path)

    monkeypatch.setattr(landlock.os, "scandir", scandir)
    rules = dict(landlock._everything_but(str(jobs)))
    assert rules[str(beside)] == landlock.ACCESS_FS_READS
    assert rules[str(tmp_path / "file")] == landlock.ACCESS_FS_FILE_READS
    assert not any(path == str(tmp_path / "link") or path.startswith(str(locked)) for path in rules), rules
    paths = (str(interpreter), str(locked), str(jobs), str(jobs / "w1" / "home"), str(tmp_path))
    assert landlock._readable_beside(paths, str(jobs)) == [str(interpreter), str(jobs / "w1" / "home")]
