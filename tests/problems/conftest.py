"""Run problem sources out of process through run_problems.py."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from problems import Problem

RUNNER = Path(__file__).with_name("run_problems.py")


def run_problems(
    problems: list[Problem], device: str = "cpu", trials: int = 10, timeout_s: float = 300.0
) -> dict[str, dict]:
    """Run each problem's forward in one subprocess; return the runner's report keyed by problem id."""
    payload = json.dumps([{"id": p.id, "source": p.source} for p in problems])
    proc = subprocess.run(
        [sys.executable, str(RUNNER), device, str(trials)],
        input=payload,
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    reports = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    return {report["id"]: report for report in reports}
