"""The time limit against the reference's own pace, on a real server: where not even a candidate as fast as the
reference could be timed before the limit, a correct candidate is `correct` without a speedup (`not_timed`), not a
`timeout` (an honest copy of a KernelBench level-2 reference ended `timeout` so on a 2-core CPU); a candidate
slower than the reference still reaches the limit on its own."""

from __future__ import annotations

import httpx

from tests.evaluator.conftest import evaluate


def busy(model: str, seconds: float, prelude: str = "", first: str = "") -> str:
    """A model whose every call keeps a core busy for `seconds` (on the CPU: the judge's clock counts it); `prelude`
    runs at import, `first` (a line of code, `self.calls` counting calls) at the start of each call."""
    return f"""
import time
import torch
{prelude}

class {model}(torch.nn.Module):
    def __init__(self, scale):
        super().__init__()
        self.scale = scale
        self.calls = 0

    def forward(self, x):
        self.calls += 1
        {first}
        started = time.perf_counter()
        while time.perf_counter() - started < {seconds}:
            pass
        return torch.relu(x) * self.scale

def get_inputs():
    return [torch.randn(64, 64)]

def get_init_inputs():
    return [2.0]
"""


def test_a_reference_too_slow_to_time_in_the_limit_leaves_a_correct_candidate_untimed(client: httpx.Client) -> None:
    # 0.6 s a call: the warm-up and one round of 10 blocks at the reference's pace need about 19 s with the margin;
    # 20 s of limit, less the runs before timing, cannot hold them.
    result = evaluate(client, busy("ModelNew", 0.6), reference=busy("Model", 0.6), timeout_s=20, seed=4321)
    assert result["status"] == "correct", result["message"]
    assert result["speedup"] is None and result["candidate_ms"] is None
    assert "not_timed" in result["flags"] and "raise `timeout_s`" in result["message"]


def test_a_candidate_slower_than_the_reference_still_reaches_the_time_limit(client: httpx.Client) -> None:
    # The reference's pace fits the limit easily; the candidate's 2 s calls do not.
    result = evaluate(client, busy("ModelNew", 2.0), reference=busy("Model", 0.01), timeout_s=15, seed=4322)
    assert result["status"] == "timeout", result["message"]
    assert "while timing" in result["message"] and "not_timed" not in result["flags"]


# Red-team candidates that had turned a deserved verdict into `not_timed` (correct, no penalty).
ZEROS_AFTER_ITS_TRIALS = "if self.calls > 2: return torch.zeros_like(x)"


def test_time_spent_before_timing_does_not_buy_not_timed(client: httpx.Client) -> None:
    """The slow candidate of the last test, sleeping 9 s at import so that little time is left: its dawdling is
    given back to the time left, so a round still fits, it is timed, and reaches the limit as before."""
    slow = busy("ModelNew", 1.0, prelude="time.sleep(9)")
    result = evaluate(client, slow, reference=busy("Model", 0.1), timeout_s=14, seed=4323)
    assert result["status"] == "timeout", result["message"]


def test_a_candidate_right_only_in_its_trials_is_stale_whatever_time_is_left(client: httpx.Client) -> None:
    # Time short by its own doing: it is timed, and its warm-up's digest or its timed blocks show the zeros. After
    # its 10 s at import about 5 s are left: more than its trials and both warm-ups need (about 1.5 s at 0.3 s a
    # call), less than the 10 s a round at the reference's pace needs with its margin. The reference's run is made
    # first, so that it takes nothing of that time: on the slow CI machine, with a 2.2 s window, the reference's
    # run and a worker's start under load ended it at the limit before its trials' outputs were written.
    reference = busy("Model", 0.3)
    assert evaluate(client, busy("ModelNew", 0.3), reference=reference, seed=4324)["status"] == "correct"
    dawdler = busy("ModelNew", 0.3, prelude="time.sleep(10)", first=ZEROS_AFTER_ITS_TRIALS)
    result = evaluate(client, dawdler, reference=reference, timeout_s=17, seed=4324)
    assert result["status"] == "rejected" and "stale_output" in result["flags"], result["message"]
    # A limit really too short for the reference: not timed, but the set it has not seen is still checked.
    short = busy("ModelNew", 0.6, first=ZEROS_AFTER_ITS_TRIALS)
    result = evaluate(client, short, reference=busy("Model", 0.6), timeout_s=20, seed=4321)
    assert result["status"] == "rejected" and "stale_output" in result["flags"], result["message"]
