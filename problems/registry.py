"""The `Problem` record and the built-in problem set.

Built-in problems live in `problems/builtin/<name>.py` as KernelBench modules. They are read as text, never
imported here: a line `PROFILE = "cpu"` picks sizes from the module's `SIZES` dict, and the "gpu" profile is the
same text with that one line rewritten.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from importlib import resources
from typing import Literal, get_args

Profile = Literal["cpu", "gpu"]
PROFILES: tuple[str, ...] = get_args(Profile)

BUILTIN_PREFIX = "builtin/"
PROFILE_LINE = re.compile(r'^PROFILE = "cpu"$', re.MULTILINE)

# Tags per built-in problem (file stem). Kept here, not in the problem files, so the source a model sees
# carries no hint of where the optimisation opportunity is.
BUILTIN_TAGS: dict[str, tuple[str, ...]] = {
    "elementwise_chain": ("elementwise", "fusion"),
    "scale_shift_clamp": ("elementwise", "fusion"),
    "gelu_tanh_manual": ("activation", "elementwise", "fusion"),
    "swish_manual": ("activation", "elementwise", "fusion"),
    "mish_manual": ("activation", "elementwise", "fusion"),
    "softmax_primitives": ("softmax", "reduction"),
    "log_softmax_primitives": ("softmax", "reduction"),
    "layernorm_manual": ("norm", "reduction"),
    "rmsnorm_manual": ("norm", "reduction"),
    "residual_add_layernorm": ("norm", "reduction", "fusion"),
    "row_l2_norm": ("reduction",),
    "variance_two_pass": ("reduction",),
    "mse_reduction": ("reduction", "loss"),
    "reverse_cumsum": ("scan",),
    "matmul_bias_relu": ("matmul", "activation", "fusion"),
    "matmul_bias_gelu": ("matmul", "activation", "fusion"),
    "conv_bn_relu": ("conv", "norm", "activation", "fusion"),
    "attention_small": ("attention", "matmul", "softmax"),
    "redundant_constant": ("redundant", "elementwise"),
    "redundant_mask": ("redundant", "softmax"),
    "redundant_transpose": ("redundant", "matmul"),
    "redundant_duplicate": ("redundant", "elementwise"),
}


@dataclass(frozen=True)
class Problem:
    """One KernelBench-format reference module and its identity."""

    id: str
    name: str
    source: str
    hash: str
    level: str
    tags: tuple[str, ...] = ()


def source_hash(source: str) -> str:
    """sha256 hex of the exact source text (UTF-8)."""
    return hashlib.sha256(source.encode("utf-8")).hexdigest()


def apply_profile(source: str, profile: Profile) -> str:
    """Return `source` with its `PROFILE = "cpu"` line set to `profile`."""
    if profile not in PROFILES:
        raise ValueError(f"unknown profile {profile!r}; choose one of {', '.join(PROFILES)}")
    rewritten, count = PROFILE_LINE.subn(f'PROFILE = "{profile}"', source)
    if count != 1:
        raise ValueError(f'expected exactly one line `PROFILE = "cpu"`, found {count}')
    return rewritten


def builtin_names() -> list[str]:
    """File stems of the built-in problems, sorted."""
    folder = resources.files("problems") / "builtin"
    return sorted(
        entry.name[: -len(".py")]
        for entry in folder.iterdir()
        if entry.name.endswith(".py") and not entry.name.startswith("_")
    )


def _builtin(name: str, profile: Profile) -> Problem:
    text = (resources.files("problems") / "builtin" / f"{name}.py").read_text(encoding="utf-8")
    source = apply_profile(text, profile)
    return Problem(
        id=BUILTIN_PREFIX + name,
        name=name,
        source=source,
        hash=source_hash(source),
        level="builtin",
        tags=BUILTIN_TAGS.get(name, ()),
    )


def builtin_problems(profile: Profile = "cpu") -> list[Problem]:
    """All built-in problems with the sizes of `profile`, sorted by id."""
    return [_builtin(name, profile) for name in builtin_names()]


def get_problem(problem_id: str, profile: Profile = "cpu") -> Problem:
    """A built-in problem by id (`builtin/<name>`, or just `<name>`).

    KernelBench problems are not addressable here: load them with `load_kernelbench`.
    """
    name = problem_id.removeprefix(BUILTIN_PREFIX)
    names = builtin_names()
    if name not in names:
        raise KeyError(f"no built-in problem {problem_id!r}; known: {', '.join(BUILTIN_PREFIX + n for n in names)}")
    return _builtin(name, profile)
