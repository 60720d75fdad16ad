"""Copies into the reference timer's `inputs` of what a candidate saved, and of a checked output the judge read from
its memory: one that does not fit (the disk full, which a job can cause) fails as the candidate's, leaves no partial
file and the directory read-only, and never makes the verdict `evaluator_error`; the service's count of what its
copies hold there follows them. Runs in a mount namespace of its own, with the timer's `inputs` a tiny tmpfs."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
SCRIPT = """
import errno, os, subprocess, sys
from pathlib import Path
from types import SimpleNamespace
from services.evaluator.evaluation import (
    EvaluatorFailure, _SavedOutputRefusedError, _copy_to_timer, _hand_over_check, _remove_check,
)
from services.evaluator.pool import Worker

root = Path(sys.argv[1])
timer = Worker(proc=None, device="cpu", root=root / "timer", home=root / "timer" / "home", uid=None)
candidate = SimpleNamespace(root=root / "candidate", uid=os.geteuid())
inputs = timer.root / "home" / "inputs"
inputs.mkdir(parents=True)
subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(inputs)], check=True)
inputs.chmod(0o555)
timer.disk_device = inputs.stat().st_dev  # what the service's copies hold there is counted (MemoryWatch)
for check, size in ((1, 4096), (2, 1 << 20)):
    saved = candidate.root / "home" / "checks" / str(check)
    saved.mkdir(parents=True)
    (saved / "0.pt").write_bytes(os.urandom(size))
for check in (1, 2, 3):
    try:
        _hand_over_check(candidate, timer, check, 2 << 20)
        print(check, "copied", sorted(os.listdir(inputs)), timer.disk_service_bytes)
    except EvaluatorFailure as error:
        print(check, "judge", error, sorted(os.listdir(inputs)), timer.disk_service_bytes)
    except OSError as error:
        print(check, "candidate", errno.errorcode[error.errno], sorted(os.listdir(inputs)), timer.disk_service_bytes)
_remove_check(timer, "check_1.pt")
print("removed", sorted(os.listdir(inputs)), oct(inputs.stat().st_mode & 0o777), timer.disk_service_bytes)
for check, size in ((4, 8192), (5, 1 << 20)):
    try:
        _copy_to_timer(timer, check, 2 << 20, lambda write: [write(os.urandom(4096)) for _ in range(size // 4096)])
        print(check, "copied", sorted(os.listdir(inputs)), oct(inputs.stat().st_mode & 0o777), timer.disk_service_bytes)
    except _SavedOutputRefusedError as error:
        print(check, "candidate", error, sorted(os.listdir(inputs)), oct(inputs.stat().st_mode & 0o777))
"""


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("unshare") is None, reason="needs root and unshare(1)")
def test_a_copy_that_does_not_fit_fails_cleanly_as_the_candidates(tmp_path: Path) -> None:
    run = subprocess.run(
        ["unshare", "--mount", "--propagation", "private", sys.executable, "-c", SCRIPT, str(tmp_path)],
        cwd=REPO_ROOT,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")]))},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stderr
    lines = run.stdout.splitlines()
    # The last number: the bytes the service's files hold on the timer's disk, by its own count.
    assert lines[0] == "1 copied ['check_1.pt'] 4096"
    # 1 MiB into a 64 KiB tmpfs: ENOSPC, the partial copy removed.
    assert lines[1] == "2 candidate ENOSPC ['check_1.pt'] 4096", lines[1]
    assert lines[2] == "3 candidate ENOENT ['check_1.pt'] 4096"
    # Still counted as the service's: the timer may still map a removed copy's pages.
    assert lines[3] == "removed [] 0o555 4096"
    # The judge's copies of checked outputs: the same rules.
    assert lines[4] == "4 copied ['check_4.raw'] 0o555 12288", lines[4]
    assert lines[5].startswith("5 candidate the disk the job shares with the judge is full ['check_4.raw'] 0o555")
