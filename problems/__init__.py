"""KernelBench-format problems: the built-in set and a loader for the real KernelBench.

Specs accepted by `load_problems`:
    "builtin"                  every built-in problem, cpu sizes ("builtin:gpu" for gpu sizes)
    "builtin/softmax_primitives" one built-in problem
    "kernelbench:1,2"          KernelBench levels 1 and 2 from $KERNELBENCH_PATH, else the HF dataset
    "kernelbench:1@/path"      level 1 from a local checkout
"""

from __future__ import annotations

from pathlib import Path

from problems.kernelbench import KernelBenchUnavailable, load_kernelbench
from problems.registry import PROFILES, Problem, Profile, builtin_names, builtin_problems, source_hash
from problems.registry import get_problem as get_builtin_problem

__all__ = [
    "KernelBenchUnavailable",
    "Problem",
    "Profile",
    "builtin_names",
    "builtin_problems",
    "get_problem",
    "load_kernelbench",
    "load_problems",
    "source_hash",
]


def get_problem(problem_id: str, profile: Profile = "cpu") -> Problem:
    """A problem by id: `builtin/<name>` or `kernelbench/level<N>/<stem>` (the latter from $KERNELBENCH_PATH or HF)."""
    if problem_id.startswith("kernelbench/"):
        parts = problem_id.split("/")
        if len(parts) != 3 or not parts[1].removeprefix("level").isdigit():
            raise KeyError(f"malformed KernelBench id {problem_id!r}; expected kernelbench/level<N>/<stem>")
        for problem in load_kernelbench(levels=(int(parts[1].removeprefix("level")),)):
            if problem.id == problem_id:
                return problem
        raise KeyError(f"no KernelBench problem {problem_id!r}")
    return get_builtin_problem(problem_id, profile)


def _parse_levels(text: str) -> tuple[int, ...]:
    try:
        levels = tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError as exc:
        raise ValueError(f"bad KernelBench levels {text!r}; expected e.g. kernelbench:1,2") from exc
    return levels or (1,)


def load_problems(spec: str, profile: Profile = "cpu") -> list[Problem]:
    """Problems named by `spec` (see the module docstring); a `:cpu`/`:gpu` suffix on builtin overrides `profile`."""
    kind, _, rest = spec.strip().partition(":")
    if kind == "builtin":
        chosen = rest or profile
        if chosen not in PROFILES:
            raise ValueError(f"unknown profile {chosen!r} in {spec!r}; use builtin:cpu or builtin:gpu")
        return builtin_problems(chosen)  # type: ignore[arg-type]
    if kind.startswith("builtin/"):
        try:
            return [get_builtin_problem(kind, rest or profile)]  # type: ignore[arg-type]
        except KeyError as exc:
            raise ValueError(exc.args[0]) from exc
    if kind == "kernelbench":
        levels_text, _, path = rest.partition("@")
        return load_kernelbench(Path(path) if path else None, _parse_levels(levels_text))
    raise ValueError(f"unknown problem spec {spec!r}; use builtin, builtin:gpu, kernelbench:1,2 or kernelbench:1@/path")
