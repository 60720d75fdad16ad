"""Multi-turn episodes of one update, run concurrently: batched generation, then every implementer request in flight
together, then every evaluator request together. No generated code runs here: the services do that."""

from __future__ import annotations

import ast
import asyncio
import hashlib
import logging
import os
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from services.trainer.config import ConfigError, TrainConfig
from services.trainer.prompts import REFERENCE_VERDICT, build_prompt, describe_verdict
from services.trainer.replicas import ReplicaPool
from services.trainer.reward import RewardValues, reward
from shared.clients import (
    AsyncEvaluatorClient,
    AsyncImplementerClient,
    EvaluatorClient,
    ImplementerClient,
    ServiceError,
)
from shared.contracts import (
    MAX_SUGGESTION_CHARS,
    EvaluateRequest,
    EvaluationResult,
    EvaluationStatus,
    HealthResponse,
    ImplementRequest,
)

log = logging.getLogger(__name__)


class FatalServiceError(RuntimeError):
    """A service refused our credentials: training cannot go on."""


class ServicesUnavailable(RuntimeError):
    """A service did not answer GET /health at start: nothing could be scored, so training does not begin."""


START_HINTS = {
    "evaluator": "start it (`kernel-agent serve evaluator --host 127.0.0.1 --port 8001` or `make serve-evaluator`) "
    "or pass the URL it listens on as --evaluator-url",
    "implementer": "start it (`IMPLEMENTER_BACKEND=builtin kernel-agent serve implementer --host 127.0.0.1 --port "
    "8002` or `make serve-implementer`) or pass the URL it listens on as --implementer-url",
}


def check_services(
    evaluator_urls: Sequence[str], implementer_urls: Sequence[str], token: str | None, retries: int
) -> dict[str, HealthResponse]:
    """GET /health of every replica, before the model loads: pointed at a dead service, a run would otherwise
    generate for minutes and score every turn `evaluator_error`. Returns the answers by URL; raises
    ServicesUnavailable naming each URL that did not answer (or answered as the other service) and the fix."""
    answers: dict[str, HealthResponse] = {}
    failures: list[str] = []
    kinds: tuple[tuple[str, Sequence[str], type[EvaluatorClient] | type[ImplementerClient]], ...] = (
        ("evaluator", evaluator_urls, EvaluatorClient),
        ("implementer", implementer_urls, ImplementerClient),
    )
    for service, urls, client_type in kinds:
        for url in urls:
            try:
                with client_type(url, token=token, timeout_s=10.0, retries=retries) as client:
                    health = client.health()
            except (ServiceError, ValueError) as exc:  # ValueError: an answer that is not a health response
                detail = exc.detail if isinstance(exc, ServiceError) else "not a kernel-agent service"
                failures.append(
                    f"the {service} at {url} does not answer GET /health ({detail}); fix: {START_HINTS[service]}"
                )
                continue
            if health.service != service:
                failures.append(
                    f"{url} is the {health.service}, not the {service}; fix: swap --evaluator-url and --implementer-url"
                )
                continue
            if health.status != "ok":
                log.warning("the %s at %s reports %s: %s", service, url, health.status, health.details)
            if service == "evaluator" and health.details.get("isolation") == "process":
                # A policy learns whatever the reward lets it: there, one job can break another's evaluation.
                log.warning(
                    "the evaluator at %s runs `process` isolation: its jobs can reach each other (docs/evaluator.md, "
                    "Isolation); train against `strict` (docker compose, or the service as root)",
                    url,
                )
            answers[url] = health
    if failures:
        raise ServicesUnavailable("; ".join(failures))
    return answers


def published_vocabulary(answers: Mapping[str, HealthResponse], implementer_urls: Sequence[str]) -> list[Any]:
    """The techniques the implementer publishes in GET /health (`details.vocabulary`: the builtin backend does), for
    `prompt_techniques`; a ConfigError naming the URL when a replica publishes none, or replicas disagree."""
    vocabularies = []
    for url in implementer_urls:
        details = answers[url].details
        if not details.get("vocabulary"):
            raise ConfigError(
                f"prompt_techniques lists the implementer's techniques in the prompt, but the implementer at {url} "
                f"(backend {details.get('backend')!r}) publishes none in GET /health; fix: run it with "
                "IMPLEMENTER_BACKEND=builtin, or set prompt_techniques false (free prose, for an LLM implementer)"
            )
        vocabularies.append(details["vocabulary"])
    if any(v != vocabularies[0] for v in vocabularies):
        raise ConfigError(
            f"the implementers {', '.join(implementer_urls)} publish different techniques; fix: run one version"
        )
    return list(vocabularies[0])


class Interrupted(Exception):
    """SIGINT/SIGTERM arrived during the rollout: the update is abandoned before any optimizer step."""


class Generate(Protocol):
    def __call__(self, prompts: list[list[int]]) -> list[tuple[list[int], str, bool]]:
        """Completion ids, decoded text and whether it ended with EOS, one per prompt."""
        ...


@dataclass
class Turn:
    """One sample: a turn of one trajectory. reward None means left out of the loss."""

    problem_id: str
    group: int
    trajectory: int
    turn: int
    prompt_ids: list[int]
    completion_ids: list[int]
    suggestion: str
    finished: bool
    implement_status: str = ""
    verdict: str | None = None
    message: str = ""
    kernel_hash: str | None = None
    reward: float | None = None
    speedup: float | None = None
    eval_latency_s: float | None = None
    evaluation_reused: bool = False
    scored_as_baseline: bool = False  # C is the reference: the baseline's verdict, not evaluated
    kernel_changed: bool | None = None  # C differs from B as a program; None when no kernel came back
    ret: float = 0.0
    advantage: float = 0.0


@dataclass
class EpisodeState:
    """(A, B, the suggestion that led from A to B), and how B fared with the evaluator, for the prompt."""

    kernel_a: str
    kernel_b: str
    suggestion: str = ""
    verdict: str = REFERENCE_VERDICT


# The verdict of a kernel that is the problem's reference (ServiceSettings.reference_is_baseline): the baseline itself,
# correct and as fast as itself by definition.
BASELINE = EvaluationResult(
    status=EvaluationStatus.correct,
    compiled=True,
    correct=True,
    speedup=1.0,
    message="the problem's reference: the baseline (speedup 1), not evaluated",
)

Evaluation = tuple[EvaluationResult | None, float, str]
"""What `Services.evaluate` returns: the result (None when the evaluator failed), latency in s, message."""


@dataclass
class ServiceSettings:
    target: str
    device: str
    timing_trials: int
    correctness_trials: int
    warmup_trials: int
    require_custom_kernel: bool
    evaluation_timeout_s: float | None
    skip_upstream_errors: bool
    rewards: RewardValues
    reuse_evaluations: bool = True
    techniques: str = ""  # the implementer's technique menu for the prompt (prompt_techniques), or none
    reference_is_baseline: bool = False


def reference_as_candidate(reference_source: str) -> str:
    """The reference with `Model` renamed `ModelNew` (class and uses, e.g. super(Model, self)), to time it."""
    tree = ast.parse(reference_source)
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef) and node.name == "Model":
            node.name = "ModelNew"
        elif isinstance(node, ast.Name) and node.id == "Model":
            node.id = "ModelNew"
    return ast.unparse(tree)


def same_program(before: str, after: str) -> bool:
    """Whether two kernels are one program: compared after parsing (comments and layout dropped) with `Model`
    renamed `ModelNew`, so a reference the implementer only renamed or re-printed counts as unchanged."""
    try:
        return reference_as_candidate(before) == reference_as_candidate(after)
    # The implementer's output is untrusted text: nesting too deep for the parser raises RecursionError or (Python's
    # parser stack) MemoryError, which must not stop training.
    except (SyntaxError, RecursionError, MemoryError):
        return before.strip() == after.strip()


def kernel_hash(source: str) -> str:
    return hashlib.sha256(source.encode()).hexdigest()[:16]


def _fatal_if_auth(exc: ServiceError) -> None:
    if exc.status_code in (401, 403):
        raise FatalServiceError(f"{exc}; fix: set the services' token in the variable named by api_token_env") from exc


@dataclass
class Services:
    """The implementer and evaluator replicas."""

    implementers: ReplicaPool[AsyncImplementerClient]
    evaluators: ReplicaPool[AsyncEvaluatorClient]
    settings: ServiceSettings

    async def implement(self, reference: str, kernel_b: str, suggestion: str) -> tuple[str, str | None, str]:
        """(status, new source, message); HTTP 5xx or no answer is `upstream_error`, another 4xx `refused`."""
        request = ImplementRequest(
            reference_source=reference,
            current_source=kernel_b,
            suggestion=suggestion[:MAX_SUGGESTION_CHARS],
            target=self.settings.target,
        )
        try:
            response = await self.implementers.call(lambda client: client.implement(request))
        except ServiceError as exc:
            _fatal_if_auth(exc)
            busy = exc.status_code is None or exc.status_code >= 500
            return ("upstream_error" if busy else "refused"), None, str(exc)[:500]
        return response.status, response.source, response.message

    async def evaluate(self, reference: str, candidate: str, seed: int | None = None) -> Evaluation:
        """(result or None when the evaluator failed, latency in s, error message); `seed` draws the inputs."""
        s = self.settings
        request = EvaluateRequest(
            reference_source=reference,
            candidate_source=candidate,
            seed=seed,
            device=s.device,  # type: ignore[arg-type]
            correctness_trials=s.correctness_trials,
            timing_trials=s.timing_trials,
            warmup_trials=s.warmup_trials,
            timeout_s=s.evaluation_timeout_s,
            require_custom_kernel=s.require_custom_kernel,
        )
        start = time.perf_counter()
        try:
            result = await self.evaluators.call(lambda client: client.evaluate(request))
        except ServiceError as exc:
            _fatal_if_auth(exc)
            return None, time.perf_counter() - start, str(exc)[:500]
        return result, time.perf_counter() - start, result.message[:500]

    async def aclose(self) -> None:
        await self.implementers.aclose()
        await self.evaluators.aclose()


def make_services(config: TrainConfig, techniques: str = "") -> Services:
    """The replicas of both services, the reward values and the request settings of `config`."""
    token = os.environ.get(config.api_token_env) or None
    retries = config.request_retries
    implementers = ReplicaPool(
        config.implementer_urls,
        lambda url: AsyncImplementerClient(url, token=token, timeout_s=config.implementer_timeout_s, retries=retries),
        config.replica_cooldown_s,
    )
    evaluators = ReplicaPool(
        config.evaluator_urls,
        lambda url: AsyncEvaluatorClient(url, token=token, timeout_s=config.evaluator_timeout_s, retries=retries),
        config.replica_cooldown_s,
    )
    rewards = RewardValues(
        config.reward_not_compiled, config.reward_incorrect, config.reward_correct_bonus, config.speedup_cap
    )
    settings = ServiceSettings(
        config.target,
        config.evaluator_device,
        config.timing_trials,
        config.correctness_trials,
        config.warmup_trials,
        config.require_custom_kernel,
        config.evaluation_timeout_s,
        config.skip_upstream_errors,
        rewards,
        config.reuse_evaluations,
        techniques,
        config.reference_is_baseline and not config.require_custom_kernel,
    )
    return Services(implementers, evaluators, settings)


async def _implement_turns(
    services: Services, problems: Sequence[Any], states: list[EpisodeState], turns: list[Turn]
) -> list[str | None]:
    """Send every non-empty suggestion to the implementer at once; returns C (or None) per turn."""
    values = services.settings.rewards

    async def one(turn: Turn, state: EpisodeState) -> str | None:
        if not turn.suggestion.strip():  # the implementer would refuse a blank suggestion (422)
            turn.implement_status, turn.reward, turn.message = "empty_suggestion", values.not_compiled, ""
            return None
        status, source, turn.message = await services.implement(
            problems[turn.group].source, state.kernel_b, turn.suggestion
        )
        turn.implement_status = status
        if status == "ok" and source:
            turn.kernel_changed = not same_program(state.kernel_b, source)
            return source
        if status != "upstream_error" or not services.settings.skip_upstream_errors:
            turn.reward = values.not_compiled  # no_code / invalid_code / refused: nothing that compiles came back
        return None

    return list(await asyncio.gather(*(one(t, s) for t, s in zip(turns, states, strict=True))))


async def _evaluate_turns(
    services: Services,
    problems: Sequence[Any],
    states: list[EpisodeState],
    turns: list[Turn],
    candidates: list[str | None],
    input_seed: int | None,
    evaluations: dict[tuple[int, str], asyncio.Task[Evaluation]],
) -> None:
    """Score every new kernel at once, set rewards, and advance the states that got a verdict.

    `evaluations` holds this update's requests by (problem, kernel hash): with `reuse_evaluations` a kernel that
    another sample of the update already produced is not sent again but takes that verdict, even while the first
    request is still in flight. Timing the same source twice measures only noise, and the noise would become the
    advantage of a group whose samples all wrote the same kernel."""

    async def one(turn: Turn, state: EpisodeState, candidate: str) -> None:
        problem = problems[turn.group]
        turn.kernel_hash = kernel_hash(candidate)
        key = (turn.group, turn.kernel_hash)
        task = evaluations.get(key) if services.settings.reuse_evaluations else None
        result: EvaluationResult | None
        if services.settings.reference_is_baseline and same_program(problem.source, candidate):
            turn.scored_as_baseline = True
            result, turn.message = BASELINE, BASELINE.message
        elif task is None:
            task = asyncio.ensure_future(services.evaluate(problem.source, candidate, input_seed))
            evaluations[key] = task
            result, turn.eval_latency_s, turn.message = await task
        else:
            turn.evaluation_reused = True
            result, _, turn.message = await task
        if result is None:
            turn.verdict = "evaluator_error"
            evaluations.pop(key, None)  # a later turn asks again rather than inherit a failed request
            return
        turn.verdict = result.status.value
        turn.reward = reward(result, services.settings.rewards)
        if turn.reward is not None and result.correct:
            turn.speedup = result.speedup
        if turn.verdict != "evaluator_error":  # the evaluator failing says nothing about C: stay on B
            state.kernel_a, state.kernel_b, state.suggestion = state.kernel_b, candidate, turn.suggestion
            state.verdict = describe_verdict(turn.verdict, turn.speedup, result.message)

    jobs = [one(t, s, c) for t, s, c in zip(turns, states, candidates, strict=True) if c is not None]
    await asyncio.gather(*jobs)


async def run_episodes(
    problems: Sequence[Any],
    num_trajectories: int,
    max_turns: int,
    tokenizer: Any,
    generate: Generate,
    services: Services,
    max_prompt_tokens: int,
    should_stop: Callable[[], bool] = lambda: False,
    input_seed: int | None = None,
) -> list[Turn]:
    """All G trajectories of every problem, turn by turn; returns every turn (rewards set, returns not yet).

    Every evaluation draws its inputs with `input_seed` (random per request when None): the samples of a GRPO
    group are then judged on the same inputs, and the evaluator runs each problem's reference once, not once
    per sample."""
    states = [EpisodeState(kernel_a=p.source, kernel_b=p.source) for p in problems for _ in range(num_trajectories)]
    evaluations: dict[tuple[int, str], asyncio.Task[Evaluation]] = {}
    index = [(g, j) for g in range(len(problems)) for j in range(num_trajectories)]
    all_turns: list[Turn] = []
    for t in range(max_turns):
        if should_stop():
            raise Interrupted
        target = services.settings.target
        prompts = [
            build_prompt(
                tokenizer,
                s.kernel_a,
                s.suggestion,
                s.kernel_b,
                target,
                max_prompt_tokens,
                verdict=s.verdict,
                techniques=services.settings.techniques,
            )
            for s in states
        ]
        completions = generate(prompts)
        turns = [
            Turn(
                problem_id=problems[g].id,
                group=g,
                trajectory=j,
                turn=t,
                prompt_ids=prompt,
                completion_ids=ids,
                suggestion=text,
                finished=finished,
            )
            for (g, j), prompt, (ids, text, finished) in zip(index, prompts, completions, strict=True)
        ]
        if should_stop():
            raise Interrupted
        candidates = await _implement_turns(services, problems, states, turns)
        await _evaluate_turns(services, problems, states, turns, candidates, input_seed, evaluations)
        all_turns.extend(turns)
        # An update's progress bar moves once all its turns are done, which on a CPU can take many minutes.
        log.info("turn %d of %d: %s", t + 1, max_turns, turn_outcomes(turns))
    return all_turns


def turn_outcomes(turns: Sequence[Turn]) -> str:
    """How many samples ended each way, e.g. `correct 2, incorrect 1, no_code 1`: the evaluator's verdict where a
    kernel was evaluated, else the implementer's status."""
    counts = Counter(turn.verdict or turn.implement_status for turn in turns)
    return ", ".join(f"{outcome} {count}" for outcome, count in counts.most_common())
