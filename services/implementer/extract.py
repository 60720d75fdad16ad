"""Pull the candidate module out of an LLM reply and validate it with `ast` only (the reply is never executed)."""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from typing import Literal

FENCE = re.compile(r"```[ \t]*([A-Za-z0-9_+-]*)[^\n]*\n(.*?)(?:```|\Z)", re.DOTALL)
PYTHON_TAGS = frozenset({"", "python", "py", "python3"})
REFUSAL = re.compile(
    r"\b(I can(?:no|')t (?:help|assist|do that|comply)|I(?:'m| am) (?:sorry|unable)|I won't|I will not|"
    r"as an AI\b|cannot assist with)",
    re.IGNORECASE,
)


@dataclass(frozen=True)
class Extraction:
    status: Literal["ok", "no_code", "invalid_code", "refused"]
    source: str | None
    message: str


def code_blocks(reply: str) -> list[str]:
    """Fenced blocks tagged as Python (or untagged), in reply order; an unterminated last fence counts."""
    return [body for tag, body in FENCE.findall(reply) if tag.lower() in PYTHON_TAGS]


def _candidate(reply: str) -> str | None:
    blocks = code_blocks(reply)
    if blocks:
        with_model = [b for b in blocks if "ModelNew" in b]
        pool = with_model or blocks
        # The last block wins ties: models tend to put the final version last.
        return max(reversed(pool), key=len)
    stripped = reply.strip()
    if stripped and "```" not in stripped and _looks_like_module(stripped):
        return stripped
    return None


def _looks_like_module(text: str) -> bool:
    """A reply that is bare code: it parses and defines or imports something (prose rarely does both)."""
    try:
        tree = ast.parse(text)
    except (SyntaxError, ValueError):
        return False
    return any(isinstance(node, ast.Import | ast.ImportFrom | ast.ClassDef | ast.FunctionDef) for node in tree.body)


def validate(source: str) -> str | None:
    """None when `source` parses and defines a class `ModelNew` at module level, else the reason."""
    try:
        tree = ast.parse(source)
    except SyntaxError as exc:
        return f"SyntaxError: {exc.msg} (line {exc.lineno})"
    except ValueError as exc:
        return f"unparsable source: {exc}"
    if not any(isinstance(node, ast.ClassDef) and node.name == "ModelNew" for node in tree.body):
        return "the module does not define `class ModelNew` at top level"
    return None


def extract(reply: str) -> Extraction:
    """Classify one reply: a valid module, code that does not validate, no code at all, or a refusal."""
    source = _candidate(reply)
    if source is None:
        if REFUSAL.search(reply):
            return Extraction("refused", None, "the model declined: " + reply.strip()[:200])
        return Extraction("no_code", None, "the reply has no ```python code block")
    error = validate(source)
    if error is not None:
        return Extraction("invalid_code", source, error)
    return Extraction("ok", source.strip() + "\n", "")
