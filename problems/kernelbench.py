"""Loader of the real KernelBench: a local checkout, or the HF dataset `ScalingIntelligence/KernelBench`.

A checkout is a folder laid out like the KernelBench repository (`<root>/KernelBench/level1/19_ReLU.py`); the path
may also point at the inner `KernelBench/` folder or at one `level<N>/` folder. Files are read as text and checked
with `ast` (they must define `Model`, `get_inputs` and `get_init_inputs`); nothing is imported or run.
"""

from __future__ import annotations

import ast
import logging
import os
import re
import socket
from collections.abc import Iterable, Sequence
from pathlib import Path
from urllib.parse import urlsplit

from problems.registry import Problem, source_hash

logger = logging.getLogger(__name__)

HF_DATASET = "ScalingIntelligence/KernelBench"
PATH_ENV = "KERNELBENCH_PATH"
LEVELS = (1, 2, 3, 4)
REQUIRED_NAMES = frozenset({"Model", "get_inputs", "get_init_inputs"})
HF_TIMEOUT_S = 10
LEVEL_DIR = re.compile(r"^level(\d+)$")
LEADING_NUMBER = re.compile(r"^(\d+)_")


class KernelBenchUnavailable(RuntimeError):
    """Neither a local checkout nor the HF dataset could be read."""


def problem_id(level: int, stem: str) -> str:
    return f"kernelbench/level{level}/{stem}"


def defined_names(source: str) -> set[str]:
    """Top-level classes, functions and assigned names of a module, by `ast`; empty if it does not parse."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return set()
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
    return names


def is_valid_reference(source: str) -> bool:
    return REQUIRED_NAMES <= defined_names(source)


def _number(stem: str) -> tuple[int, str]:
    match = LEADING_NUMBER.match(stem)
    return (int(match.group(1)) if match else 1 << 30, stem)


def _level_dirs(root: Path) -> dict[int, Path]:
    """Map level number to its folder, whichever of the three accepted paths `root` is."""
    if match := LEVEL_DIR.match(root.name):
        return {int(match.group(1)): root}
    base = root / "KernelBench" if (root / "KernelBench").is_dir() else root
    found = {int(m.group(1)): d for d in base.iterdir() if d.is_dir() and (m := LEVEL_DIR.match(d.name))}
    if not found:
        raise KernelBenchUnavailable(
            f"{root}: no KernelBench/level<N>/ folders found (expected a KernelBench checkout)"
        )
    return found


def _make_problem(level: int, stem: str, source: str, where: str) -> Problem | None:
    if not is_valid_reference(source):
        logger.warning("skipping %s: does not define Model, get_inputs and get_init_inputs", where)
        return None
    return Problem(
        id=problem_id(level, stem),
        name=stem,
        source=source,
        hash=source_hash(source),
        level=f"level{level}",
        tags=("kernelbench",),
    )


def load_checkout(path: str | Path, levels: Sequence[int] = (1,)) -> list[Problem]:
    """Problems of `levels` from a local checkout, by level then leading problem number."""
    root = Path(path).expanduser()
    if not root.is_dir():
        raise KernelBenchUnavailable(
            f"{root}: not a folder; point {PATH_ENV} or --kernelbench at a KernelBench checkout"
        )
    dirs = _level_dirs(root)
    problems: list[Problem] = []
    for level in sorted(set(levels)):
        folder = dirs.get(level)
        if folder is None:
            logger.warning("%s: no level%d folder", root, level)
            continue
        for file in sorted(folder.glob("*.py"), key=lambda f: _number(f.stem)):
            try:
                source = file.read_text(encoding="utf-8")
            except (OSError, UnicodeDecodeError) as exc:
                logger.warning("skipping %s: %s", file, exc)
                continue
            if (problem := _make_problem(level, file.stem, source, str(file))) is not None:
                problems.append(problem)
    return problems


def _offline_mode() -> bool:
    return any(
        os.environ.get(name, "").lower() in {"1", "true", "yes", "on"}
        for name in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE")
    )


def _check_hub_reachable() -> None:
    """Fail within HF_TIMEOUT_S when the Hub cannot be reached, instead of waiting out the hub's own retries."""
    endpoint = urlsplit(os.environ.get("HF_ENDPOINT", "https://huggingface.co"))
    port = endpoint.port or (443 if endpoint.scheme == "https" else 80)
    try:
        socket.create_connection((endpoint.hostname or "", port), timeout=HF_TIMEOUT_S).close()
    except OSError as exc:
        raise KernelBenchUnavailable(
            f"cannot reach {endpoint.geturl()} to download {HF_DATASET} ({exc}). Clone "
            f"https://github.com/ScalingIntelligence/KernelBench and set {PATH_ENV}=/path/to/KernelBench or pass the "
            "checkout path; or set HF_HUB_OFFLINE=1 to use a copy already in the HF cache."
        ) from exc


def _hf_rows(level: int) -> Iterable[dict[str, object]]:
    os.environ.setdefault("HF_HUB_ETAG_TIMEOUT", str(HF_TIMEOUT_S))
    os.environ.setdefault("HF_HUB_DOWNLOAD_TIMEOUT", str(HF_TIMEOUT_S))
    if not _offline_mode():
        _check_hub_reachable()
    try:
        import datasets
    except ImportError as exc:
        raise KernelBenchUnavailable(
            f"reading the HF dataset {HF_DATASET} needs the `datasets` package (pip install datasets); "
            f"or set {PATH_ENV} to a KernelBench checkout"
        ) from exc
    try:
        return datasets.load_dataset(HF_DATASET, split=f"level_{level}")  # type: ignore[no-any-return]
    except Exception as exc:  # datasets raises many types (ConnectionError, OfflineModeIsEnabled, FileNotFound...)
        raise KernelBenchUnavailable(
            f"could not load the HF dataset {HF_DATASET} (level_{level}): {type(exc).__name__}: {exc}. "
            f"Offline? Clone https://github.com/ScalingIntelligence/KernelBench and set {PATH_ENV}=/path/to/KernelBench "
            "or pass the checkout path."
        ) from exc


def load_hf(levels: Sequence[int] = (1,)) -> list[Problem]:
    """Problems of `levels` from the HF dataset, by level then problem number."""
    problems: list[Problem] = []
    for level in sorted(set(levels)):
        rows = sorted(_hf_rows(level), key=lambda row: int(str(row["problem_id"])))
        for row in rows:
            stem = str(row["name"]).removesuffix(".py")
            if not LEADING_NUMBER.match(stem):
                stem = f"{row['problem_id']}_{stem}"
            where = f"{HF_DATASET}:level_{level}:{stem}"
            if (problem := _make_problem(level, stem, str(row["code"]), where)) is not None:
                problems.append(problem)
    return problems


def load_kernelbench(path: str | Path | None = None, levels: Sequence[int] = (1,)) -> list[Problem]:
    """KernelBench problems of `levels` from `path`, else from $KERNELBENCH_PATH, else from the HF dataset."""
    bad = [level for level in levels if level not in LEVELS]
    if bad:
        raise ValueError(f"unknown KernelBench level(s) {bad}; levels are {', '.join(map(str, LEVELS))}")
    path = path or os.environ.get(PATH_ENV) or None
    return load_checkout(path, levels) if path else load_hf(levels)
