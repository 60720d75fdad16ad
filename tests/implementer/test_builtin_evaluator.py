"""The builtin backend end to end: the real implementer service rewrites built-in problems, the real evaluator scores
them on CPU. Each technique on at least one problem where it applies, plus composition across turns.

The full technique x problem matrix is `scripts/technique_table.py` (too long for CI).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from problems import get_problem
from services.evaluator.config import HACK_FLAGS
from services.implementer.rules import TECHNIQUES
from shared.clients import EvaluatorClient, ImplementerClient
from shared.contracts import EvaluateRequest, EvaluationResult, ImplementRequest, ImplementResponse, Target
from tests.implementer.conftest import service_env
from tests.servers import run_service

EXAMPLE = {t.name: t.example for t in TECHNIQUES}
# A 10x faster rewrite on 2 loaded cores ended unverified_timing in 3 of 8 timings (0 of 10 unloaded).
UNVERIFIED_RETRIES = 4


@dataclass(frozen=True)
class Case:
    technique: str
    problem: str
    target: Target = "cuda"
    # Asserted only for large gains (above 1.5 in every quiet CI run), with a bound a loaded machine still clears:
    # hoist_constants measured 1.46 while another trainer shared the two cores; a rewrite that does nothing is ~1.0.
    min_speedup: float | None = None


CASES = [
    Case("fused_library_calls", "layernorm_manual", min_speedup=1.25),
    Case("hoist_constants", "redundant_transpose", min_speedup=1.25),
    Case("remove_redundant", "redundant_duplicate"),
    Case("inplace_ops", "elementwise_chain"),
    Case("fuse_elementwise", "scale_shift_clamp"),
    Case("fuse_elementwise", "swish_manual", target="triton"),
    Case("fuse_elementwise", "gelu_tanh_manual", target="torch"),
    Case("cuda_graphs", "elementwise_chain"),
    Case("tf32", "matmul_bias_relu"),
    Case("channels_last", "conv_bn_relu"),
    Case("cudnn_benchmark", "conv_bn_relu"),
    Case("half_precision", "matmul_bias_relu"),
    Case("torch_compile", "elementwise_chain"),
]


@pytest.fixture(scope="module")
def services() -> Iterator[tuple[ImplementerClient, EvaluatorClient]]:
    with (
        run_service("evaluator", env=service_env(), timeout_s=300) as eval_url,
        run_service("implementer", env=service_env(IMPLEMENTER_BACKEND="builtin")) as impl_url,
        ImplementerClient(impl_url) as implementer,
        EvaluatorClient(eval_url, timeout_s=900) as evaluator,
    ):
        yield implementer, evaluator


def implement(
    client: ImplementerClient, problem: str, current: str, technique: str, target: Target = "cuda"
) -> ImplementResponse:
    reference = get_problem(f"builtin/{problem}").source
    return client.implement(
        ImplementRequest(
            reference_source=reference, current_source=current, suggestion=EXAMPLE[technique], target=target
        )
    )


def evaluate(client: EvaluatorClient, problem: str, candidate: str, timing_trials: int = 20) -> EvaluationResult:
    return client.evaluate(
        EvaluateRequest(
            reference_source=get_problem(f"builtin/{problem}").source,
            candidate_source=candidate,
            device="cpu",
            correctness_trials=3,
            timing_trials=timing_trials,
            warmup_trials=3,
            timeout_s=800,
            seed=0,
        )
    )


@pytest.fixture(scope="module")
def verdicts(
    services: tuple[ImplementerClient, EvaluatorClient],
) -> dict[Case, tuple[ImplementResponse, EvaluationResult]]:
    """Every case implemented, then scored one at a time: two evaluations timed at once on a 2-core machine leave
    the judge's clock too noisy to verify a speedup, which it then does not credit (unverified_timing)."""
    implementer, evaluator = services

    def run(case: Case) -> tuple[ImplementResponse, EvaluationResult]:
        reference = get_problem(f"builtin/{case.problem}").source
        reply = implement(implementer, case.problem, reference, case.technique, case.target)
        assert reply.status == "ok" and reply.techniques == [case.technique], reply.message
        result = evaluate(evaluator, case.problem, reply.source or "")
        # Where the judge says its clock was too noisy to check a speedup (unverified_timing: it then credits
        # none), the speed is measured again, at most four times. A rewrite that gains nothing still fails.
        for _ in range(UNVERIFIED_RETRIES if case.min_speedup is not None else 0):
            if "unverified_timing" not in result.flags:
                break
            result = evaluate(evaluator, case.problem, reply.source or "")
        if result.status.value == "rejected" and result.flags == ["implausible_timing"]:
            # Evaluated once more where the judge took an honest rewrite's slower process for work moved out of its
            # calls (scale_shift_clamp's fused rewrite in one full test run, its digest 28 % slower than the
            # timer's; none in 30 evaluations here with huge pages and 30 without): a rewrite the judge is biased
            # against fails twice in a row.
            first = f"first: {result.flags} {result.message[-300:]}"
            result = evaluate(evaluator, case.problem, reply.source or "")
            result = result.model_copy(update={"message": f"{result.message}; {first}"})
        return reply, result

    return {case: run(case) for case in CASES}


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c.technique}-{c.problem}-{c.target}")
def test_technique_is_scored_correct(case: Case, verdicts: dict) -> None:
    reply, result = verdicts[case]
    if case.technique == "half_precision":  # a precision downgrade may fail correctness; it must still run
        assert result.compiled and result.status.value in ("correct", "incorrect"), result.message
        return
    assert result.status.value == "correct", f"{result.status.value}: {result.flags} {result.message}"
    assert not set(result.flags) & HACK_FLAGS, result.flags  # advisory flags (timed_by_judge) may appear under load
    if case.min_speedup is not None:
        assert result.speedup is not None and result.speedup > case.min_speedup, result.speedup


def test_techniques_compose_across_turns(services: tuple[ImplementerClient, EvaluatorClient]) -> None:
    implementer, evaluator = services
    source = get_problem("builtin/matmul_bias_relu").source
    turns = ["fused_library_calls", "inplace_ops", "cuda_graphs", "tf32"]
    for technique in turns:
        reply = implement(implementer, "matmul_bias_relu", source, technique)
        assert reply.status == "ok" and reply.techniques == [technique], reply.message
        source = reply.source or ""
    assert source.startswith("# kernel-agent techniques: fused_library_calls, inplace_ops, tf32, cuda_graphs\n")
    again = implement(implementer, "matmul_bias_relu", source, "cuda_graphs")
    assert again.techniques == [] and "already applied" in again.message and again.source == source
    result = evaluate(evaluator, "matmul_bias_relu", source, timing_trials=5)
    assert result.status.value == "correct" and not set(result.flags) & HACK_FLAGS, result.message


def test_generated_kernel_composes_with_a_later_turn(services: tuple[ImplementerClient, EvaluatorClient]) -> None:
    implementer, evaluator = services
    fused = implement(
        implementer, "scale_shift_clamp", get_problem("builtin/scale_shift_clamp").source, "fuse_elementwise"
    )
    graphed = implement(implementer, "scale_shift_clamp", fused.source or "", "cuda_graphs")
    assert graphed.techniques == ["cuda_graphs"] and "load_inline" in (graphed.source or "")
    result = evaluate(evaluator, "scale_shift_clamp", graphed.source or "", timing_trials=5)
    assert result.status.value == "correct" and not set(result.flags) & HACK_FLAGS, result.message
