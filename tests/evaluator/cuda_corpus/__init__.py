"""CUDA candidates as LLMs write them for KernelBench-format problems, for the split build's tests.

Each `cNN_*.py` is a candidate module (`ModelNew`, a `load_inline` call at import) whose first lines name its
reference problem (`# reference: NAME`, a module in `references/`) and the verdict a whole build gets
(`# expect: correct|incorrect|compile_error|runtime_error`), then what the candidate exercises.
"""

from __future__ import annotations

import inspect
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

CORPUS_DIR = Path(__file__).resolve().parent
VERDICTS = ("correct", "incorrect", "compile_error", "runtime_error")


@dataclass(frozen=True)
class Case:
    name: str
    source: str
    reference: str
    reference_source: str
    expect: str
    summary: str


def _header(source: str, field: str) -> str:
    found = re.search(rf"^# {field}: (.+)$", source, re.MULTILINE)
    if found is None:
        raise ValueError(f"no '# {field}:' line")
    return found.group(1).strip()


def cases() -> list[Case]:
    found = []
    for path in sorted(CORPUS_DIR.glob("c[0-9][0-9]_*.py")):
        source = path.read_text()
        reference = _header(source, "reference")
        expect = _header(source, "expect")
        if expect not in VERDICTS:
            raise ValueError(f"{path.name}: unknown verdict {expect}")
        summary = source.splitlines()[2].lstrip("# ").strip()
        reference_source = (CORPUS_DIR / "references" / f"{reference}.py").read_text()
        found.append(Case(path.stem, source, reference, reference_source, expect, summary))
    return found


def load_inline_calls(source: str) -> list[dict[str, Any]]:
    """The keyword arguments of every `load_inline` call the candidate makes at import, without building.

    Runs the candidate's module body (our own corpus, trusted) with `load_inline` replaced by a recorder.
    """
    import torch.utils.cpp_extension as cpp_extension

    calls: list[dict[str, Any]] = []
    signature = inspect.signature(cpp_extension.load_inline)

    def record(*args: Any, **kwargs: Any) -> object:
        calls.append(dict(signature.bind(*args, **kwargs).arguments))
        return object()

    original = cpp_extension.load_inline
    cpp_extension.load_inline = record
    try:
        exec(compile(source, "<candidate>", "exec"), {"__name__": "candidate"})
    finally:
        cpp_extension.load_inline = original
    return calls
