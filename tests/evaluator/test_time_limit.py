"""The time limit against the reference's own pace, on a real server: where not even a candidate as fast as the
reference could be timed before the limit, a correct candidate is `correct` without a speedup (`not_timed`), not a
`timeout` (an honest copy of a KernelBench level-2 reference ended `timeout` so on a 2-core CPU); a candidate
slower than the reference still reaches the limit on its own."""

from __future__ import annotations

import httpx

from tests.evaluator.conftest import evaluate


def busy(model: str, seconds: float) -> str:
    """A model whose every call keeps a core busy for `seconds` (on the CPU: the judge's clock counts it)."""
    return f"""
import time
import torch

class {model}(torch.nn.Module):
    def __init__(self, scale):
        super().__init__()
        self.scale = scale

    def forward(self, x):
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
