"""Copies into a worker's `inputs`: a copy that fails on the service's side (its disk full) is the judge's failure,
never the candidate's wrong answer. Runs in a mount namespace of its own, with the timer's `inputs` a tiny tmpfs."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
SCRIPT = """
import os, subprocess, sys
from pathlib import Path
from types import SimpleNamespace
from services.evaluator.evaluation import EvaluatorFailure, _hand_over_check, _remove_check

root = Path(sys.argv[1])
timer = SimpleNamespace(root=root / "timer")
candidate = SimpleNamespace(root=root / "candidate", uid=os.geteuid())
inputs = timer.root / "home" / "inputs"
inputs.mkdir(parents=True)
subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(inputs)], check=True)
inputs.chmod(0o555)
for check, size in ((1, 4096), (2, 1 << 20)):
    saved = candidate.root / "home" / "checks" / str(check)
    saved.mkdir(parents=True)
    (saved / "0.pt").write_bytes(os.urandom(size))
for check in (1, 2, 3):
    try:
        _hand_over_check(candidate, timer, check, 2 << 20)
        print(check, "copied", sorted(os.listdir(inputs)))
    except EvaluatorFailure as error:
        print(check, "judge", error, sorted(os.listdir(inputs)))
    except OSError as error:
        print(check, "candidate", type(error).__name__, sorted(os.listdir(inputs)))
_remove_check(timer, 1)
print("removed", sorted(os.listdir(inputs)), oct(inputs.stat().st_mode & 0o777))
"""


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("unshare") is None, reason="needs root and unshare(1)")
def test_a_full_disk_on_the_timer_side_is_the_judges_failure(tmp_path: Path) -> None:
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
    assert lines[0] == "1 copied ['check_1.pt']"
    # 1 MiB into a 64 KiB tmpfs: ENOSPC, the partial copy removed.
    assert lines[1].startswith("2 judge ") and "No space left" in lines[1], lines[1]
    assert lines[1].endswith("['check_1.pt']")
    # No file saved: the candidate's.
    assert lines[2] == "3 candidate FileNotFoundError ['check_1.pt']"
    assert lines[3] == "removed [] 0o555"
