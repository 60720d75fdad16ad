"""The judge's CPU clock of a job, with real processes: a helper that burned CPU before a block and exits in it must
not shorten the block's clock (a sum of the processes' totals subtracted what it had used)."""

from __future__ import annotations

import subprocess
import sys
import time

from services.evaluator.evaluation import _cpu_clocks, _cpu_used_s

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
