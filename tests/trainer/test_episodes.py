"""Episode bookkeeping for the failure modes the real builtin services never produce: an implementer upstream error
(left out, state kept), no_code (-1, state kept), an evaluator error (never -1, state kept), an empty suggestion
(-1 without an implementer call). The services are stand-ins here; the integration test uses the real ones."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from services.trainer.config import TrainConfig
from services.trainer.episodes import Services, ServiceSettings, reference_as_candidate, run_episodes
from services.trainer.grpo import evaluation_seed
from services.trainer.replicas import ReplicaPool
from services.trainer.reward import RewardValues
from shared.clients import ServiceError
from shared.contracts import EvaluationResult, EvaluationStatus, ImplementResponse, TimingStats

REFERENCE = (
    "import torch\n\nclass Model(torch.nn.Module):\n    def __init__(self):\n"
    "        super(Model, self).__init__()\n\n    def forward(self, x):\n        return torch.relu(x)\n"
)


@dataclass(frozen=True)
class FakeProblem:
    id: str = "builtin/relu"
    source: str = REFERENCE
    hash: str = "h0"


def _ms(value: float) -> TimingStats:
    return TimingStats(median=value, mean=value, std=0.0, min=value, max=value, n=5)


def _correct(candidate_ms: float) -> EvaluationResult:
    """A correct verdict with a 2 ms reference timed in the same evaluation."""
    return EvaluationResult(
        status=EvaluationStatus.correct,
        compiled=True,
        correct=True,
        device="cpu",
        reference_ms=_ms(2.0),
        candidate_ms=_ms(candidate_ms),
        speedup=2.0 / candidate_ms,
    )


class ScriptedImplementer:
    """Answers by the suggestion's text; records what it was asked."""

    def __init__(self) -> None:
        self.asked: list[tuple[str, str]] = []

    async def implement(self, request):
        self.asked.append((request.suggestion, request.current_source))
        if request.suggestion.startswith("down"):
            raise ServiceError("implementer", 503, "LLM overloaded")
        if request.suggestion.startswith("nocode"):
            return ImplementResponse(status="no_code", backend="scripted")
        return ImplementResponse(status="ok", backend="scripted", source=f"# from {request.suggestion}\n")

    async def aclose(self) -> None:
        return None


class ScriptedEvaluator:
    def __init__(self) -> None:
        self.seeds: list[int | None] = []

    async def evaluate(self, request):
        self.seeds.append(request.seed)
        if request.candidate_source.startswith("# from evalfail"):
            return EvaluationResult(
                status=EvaluationStatus.evaluator_error, compiled=False, correct=False, device="cpu"
            )
        return _correct(1.0 if "fast" in request.candidate_source else 2.0)

    async def aclose(self) -> None:
        return None


def test_failure_modes_rewards_and_state(tokenizer):
    implementer = ScriptedImplementer()
    settings = ServiceSettings("cuda", "auto", 5, 1, 1, False, None, True, RewardValues())
    services = Services(
        ReplicaPool(["i"], lambda _: implementer), ReplicaPool(["e"], lambda _: ScriptedEvaluator()), settings
    )
    # trajectory j's suggestions at turns 0 and 1
    script = {
        0: ["down", "fast again"],
        1: ["nocode", "fast"],
        2: ["evalfail", "fast"],
        3: ["", "fast"],
        4: ["fast", "fast2"],
    }
    calls = {"n": 0}

    def generate(prompts):
        turn = calls["n"]
        calls["n"] += 1
        return [([7, 2], script[j][turn], True) for j in range(len(prompts))]

    turns = asyncio.run(run_episodes([FakeProblem()], 5, 2, tokenizer, generate, services, 1024))
    by = {(t.trajectory, t.turn): t for t in turns}
    assert by[(0, 0)].implement_status == "upstream_error" and by[(0, 0)].reward is None
    assert by[(1, 0)].implement_status == "no_code" and by[(1, 0)].reward == -1.0
    assert by[(2, 0)].verdict == "evaluator_error" and by[(2, 0)].reward is None
    assert by[(3, 0)].implement_status == "empty_suggestion" and by[(3, 0)].reward == -1.0
    assert by[(4, 0)].verdict == "correct" and by[(4, 0)].reward == 0.3 + 2.0  # reference 2 ms / candidate 1 ms
    assert by[(4, 0)].speedup == 2.0
    # at turn 1, trajectories 0-3 still start from the reference (no advance); 4 starts from its new kernel
    sources = dict(implementer.asked)
    for suggestion in ("fast again", "fast"):
        assert sources[suggestion] == REFERENCE
    assert sources["fast2"] == "# from fast\n"
    assert "" not in sources  # the empty suggestion never reached the implementer


def test_each_turn_is_reported_as_it_ends(tokenizer, caplog):
    settings = ServiceSettings("cuda", "auto", 5, 1, 1, False, None, True, RewardValues())
    services = Services(
        ReplicaPool(["i"], lambda _: ScriptedImplementer()), ReplicaPool(["e"], lambda _: ScriptedEvaluator()), settings
    )
    suggestions = iter([["fast", "nocode", "fast", "evalfail"], ["", "fast", "down", "fast"]])

    def generate(prompts):
        return [([7, 2], text, True) for text in next(suggestions)]

    with caplog.at_level("INFO", logger="services.trainer.episodes"):
        asyncio.run(run_episodes([FakeProblem()], 4, 2, tokenizer, generate, services, 1024))
    assert [record.getMessage() for record in caplog.records if record.getMessage().startswith("turn ")] == [
        "turn 1 of 2: correct 2, no_code 1, evaluator_error 1",
        "turn 2 of 2: correct 2, empty_suggestion 1, upstream_error 1",
    ]


def test_reference_renamed_as_a_candidate():
    renamed = reference_as_candidate(REFERENCE)
    assert "class ModelNew(torch.nn.Module)" in renamed and "super(ModelNew, self)" in renamed
    assert "Model(" not in renamed.replace("ModelNew(", "")


def test_one_input_seed_per_update(tokenizer):
    evaluator = ScriptedEvaluator()
    settings = ServiceSettings("cuda", "auto", 5, 1, 1, False, None, True, RewardValues())
    services = Services(
        ReplicaPool(["i"], lambda _: ScriptedImplementer()), ReplicaPool(["e"], lambda _: evaluator), settings
    )

    turn = iter(range(2))

    def generate(prompts):
        t = next(turn)
        return [([7, 2], f"fast {j} at turn {t}", True) for j in range(len(prompts))]  # every kernel different

    asyncio.run(run_episodes([FakeProblem()], 3, 2, tokenizer, generate, services, 1024, input_seed=1234))
    assert evaluator.seeds == [1234] * (3 * 2)  # 3 trajectories x 2 turns, no extra baseline run


class NoisyEvaluator:
    """Every request takes a while (so duplicates are in flight together) and times 10 % slower than the last."""

    def __init__(self) -> None:
        self.candidates: list[str] = []

    async def evaluate(self, request):
        self.candidates.append(request.candidate_source)
        calls = len(self.candidates)
        await asyncio.sleep(0.05)
        if request.candidate_source == "# from broken\n" and self.candidates.count(request.candidate_source) == 1:
            raise ServiceError("evaluator", 503, "worker pool restarting")
        return _correct(2.0 * 1.1**calls)

    async def aclose(self) -> None:
        return None


def _run_with(reuse: bool, tokenizer) -> tuple[list, NoisyEvaluator]:
    evaluator = NoisyEvaluator()
    settings = ServiceSettings("cuda", "auto", 5, 1, 1, False, None, True, RewardValues(), reuse)
    services = Services(
        ReplicaPool(["i"], lambda _: ScriptedImplementer()), ReplicaPool(["e"], lambda _: evaluator), settings
    )
    # trajectory j's suggestions at turns 0 and 1; the implementer writes "# from <suggestion>"
    script = {0: ["same", "same"], 1: ["same", "other"], 2: ["other", "broken"], 3: ["broken", "broken"]}
    calls = {"n": 0}

    def generate(prompts):
        turn = calls["n"]
        calls["n"] += 1
        return [([7, 2], script[j][turn], True) for j in range(len(prompts))]

    turns = asyncio.run(run_episodes([FakeProblem()], 4, 2, tokenizer, generate, services, 1024, input_seed=7))
    return turns, evaluator


def test_identical_kernels_are_evaluated_once_per_update(tokenizer):
    turns, evaluator = _run_with(True, tokenizer)
    by = {(t.trajectory, t.turn): t for t in turns}
    sent = evaluator.candidates
    # turn 0: "same" once for two samples in flight together, "other" once, "broken" fails;
    # turn 1: "same" and "other" reuse turn 0's verdicts, "broken" is asked again (failures are not kept)
    assert sorted(sent) == sorted(["# from same\n", "# from other\n", "# from broken\n", "# from broken\n"])
    same = [by[(0, 0)], by[(1, 0)], by[(0, 1)]]
    assert len({t.reward for t in same}) == 1 and same[0].reward is not None
    assert by[(1, 1)].reward == by[(2, 0)].reward  # "other" at turn 1 took turn 0's verdict
    assert by[(3, 0)].verdict == "evaluator_error" and by[(3, 0)].reward is None
    assert by[(2, 1)].verdict == by[(3, 1)].verdict == "correct" and by[(2, 1)].reward == by[(3, 1)].reward
    assert [t.evaluation_reused for t in same].count(False) == 1
    assert all(t.eval_latency_s is None for t in turns if t.evaluation_reused)


def test_without_reuse_every_kernel_is_evaluated(tokenizer):
    turns, evaluator = _run_with(False, tokenizer)
    assert len(evaluator.candidates) == 8  # every sample
    by = {(t.trajectory, t.turn): t for t in turns}
    assert by[(0, 0)].reward != by[(1, 0)].reward  # the same kernel, timed twice, differs by the "noise"
    assert not any(t.evaluation_reused for t in turns)


def test_evaluation_seed_is_new_each_update_and_reproducible():
    seeds = [evaluation_seed(0, update) for update in range(1, 51)]
    assert len(set(seeds)) == 50 and all(0 <= s < 2**31 for s in seeds)
    assert seeds == [evaluation_seed(0, update) for update in range(1, 51)]  # a resumed run draws the same
    assert evaluation_seed(1, 1) != evaluation_seed(0, 1)


class RenamingImplementer:
    """The builtin backend's answer to a suggestion it cannot apply: B re-printed, `Model` renamed, a marker."""

    async def implement(self, request):
        source = reference_as_candidate(request.current_source) + "\n# kernel-agent techniques: none\n"
        if request.suggestion == "fuse":
            source = source.replace("torch.relu(x)", "torch.relu_(x)")
        return ImplementResponse(status="ok", backend="scripted", source=source)

    async def aclose(self) -> None:
        return None


def test_a_kernel_only_renamed_or_reprinted_did_not_change(tokenizer):
    from services.trainer.grpo import rollout_metrics

    settings = ServiceSettings("cuda", "auto", 5, 1, 1, False, None, True, RewardValues())
    services = Services(
        ReplicaPool(["i"], lambda _: RenamingImplementer()), ReplicaPool(["e"], lambda _: ScriptedEvaluator()), settings
    )
    suggestions = ["make it faster", "fuse", "make it faster", "make it faster"]

    def generate(prompts):
        return [([7, 2], suggestions[j], True) for j in range(len(prompts))]

    turns = asyncio.run(run_episodes([FakeProblem()], 4, 1, tokenizer, generate, services, 1024))
    assert [t.kernel_changed for t in turns] == [False, True, False, False]
    metrics = rollout_metrics(turns, [t for t in turns if t.reward is not None], TrainConfig(num_trajectories=4))
    assert metrics["rate/kernel_changed"] == 0.25


class BrokenThenFine:
    """C of `break` does not compile; anything else is correct."""

    async def evaluate(self, request):
        if "from break" in request.candidate_source:
            return EvaluationResult(
                status=EvaluationStatus.compile_error,
                compiled=False,
                correct=False,
                device="cpu",
                message="kernel.cu(12): error: expected a ';'",
            )
        return _correct(1.0)

    async def aclose(self) -> None:
        return None


def test_the_next_prompt_says_how_kernel_b_fared(tokenizer):
    settings = ServiceSettings("cuda", "auto", 5, 1, 1, False, None, True, RewardValues())
    services = Services(
        ReplicaPool(["i"], lambda _: ScriptedImplementer()), ReplicaPool(["e"], lambda _: BrokenThenFine()), settings
    )
    seen: list[list[str]] = []

    def generate(prompts):
        seen.append([tokenizer.decode(p) for p in prompts])
        return [([7, 2], ["break", "fast"][j], True) for j in range(len(prompts))]

    asyncio.run(run_episodes([FakeProblem()], 2, 2, tokenizer, generate, services, 1024))
    assert all("it is the reference" in text for text in seen[0])
    assert "it does not compile. kernel.cu(12): error: expected a ';'" in seen[1][0]  # B is the broken kernel
    assert "correct, 2.00x the reference's speed." in seen[1][1]  # reference 2 ms, candidate 1 ms


def test_the_reference_itself_takes_the_baseline_verdict_unevaluated(tokenizer):
    from services.trainer.episodes import make_services

    evaluator = ScriptedEvaluator()
    settings = ServiceSettings(
        "cuda", "auto", 5, 1, 1, False, None, True, RewardValues(speedup_cap=0.5), reference_is_baseline=True
    )
    services = Services(
        ReplicaPool(["i"], lambda _: RenamingImplementer()), ReplicaPool(["e"], lambda _: evaluator), settings
    )
    suggestions = ["make it faster", "fuse", "make it faster"]

    def generate(prompts):
        return [([7, 2], suggestions[j], True) for j in range(len(prompts))]

    turns = asyncio.run(run_episodes([FakeProblem()], 3, 2, tokenizer, generate, services, 1024, input_seed=3))
    by = {(t.trajectory, t.turn): t for t in turns}
    # only "fuse" changed the program: evaluated once, at turn 0 (turn 1 re-prints it: the verdict is reused)
    assert evaluator.seeds == [3] and by[(1, 1)].evaluation_reused
    for j in (0, 2):
        for t in (0, 1):
            baseline = by[(j, t)]
            assert baseline.scored_as_baseline and baseline.verdict == "correct" and baseline.speedup == 1.0
            assert baseline.reward == 0.3 + 0.5  # the reward function's own cap applies to it too
            assert baseline.eval_latency_s is None
    assert not by[(1, 0)].scored_as_baseline and by[(1, 0)].speedup == 1.0  # measured: 2 ms against 2 ms
    # with require_custom_kernel the evaluator rejects the reference, so it is sent like any kernel
    urls = {"evaluator_urls": ["http://127.0.0.1:1"], "implementer_urls": ["http://127.0.0.1:2"]}
    assert not make_services(TrainConfig(require_custom_kernel=True, **urls)).settings.reference_is_baseline
    assert make_services(TrainConfig(**urls)).settings.reference_is_baseline


def test_a_kernel_nested_too_deep_to_parse_is_compared_as_text():
    from services.trainer.episodes import same_program

    for deep in ("x = " + "-" * 100_000 + "1", "x = 1" + " + 1" * 100_000):
        assert same_program(REFERENCE, deep) is False
        assert same_program(deep, deep) is True
