"""The suggester's prompt: named text constants and the token-budgeted fill-in (kernel A is cut first, then B)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

SYSTEM_PROMPT = (
    "You are a GPU performance engineer. You read PyTorch modules and GPU kernels and propose one concrete "
    "optimization at a time; another engineer implements it."
)

TARGET_WORDS = {
    "cuda": "CUDA C++ (compiled inline with torch.utils.cpp_extension.load_inline)",
    "triton": "Triton",
    "torch": "PyTorch operations only",
}

KERNEL_A_SECTION = "Kernel A (the previous version):\n```python\n{kernel}\n```\n\n"
KERNEL_A_SAME = "Kernel A: the same as kernel B (no change made yet).\n\n"
SUGGESTION_SECTION = "Suggestion that turned kernel A into kernel B:\n{suggestion}\n\n"
NO_SUGGESTION = "Suggestion that turned kernel A into kernel B: none yet; kernel B is the reference.\n\n"
KERNEL_B_SECTION = "Kernel B (the current version):\n```python\n{kernel}\n```\n\n"
# How kernel B fared with the evaluator, as multi-turn kernel RL shows it: a broken B needs a fix, not a speed-up.
VERDICT_SECTION = "Kernel B's evaluation: {verdict}\n\n"
REFERENCE_VERDICT = "correct, 1.00x the reference's speed (it is the reference)."
VERDICTS = {
    "correct": "correct, {speedup} the reference's speed.",
    "incorrect": "it compiles and runs, but its outputs differ from the reference's. {message}",
    "compile_error": "it does not compile. {message}",
    "runtime_error": "it compiles but fails while running. {message}",
    "timeout": "it timed out. {message}",
    "crashed": "its process crashed. {message}",
    "rejected": "rejected by the evaluator's checks. {message}",
}
MESSAGE_HEAD_CHARS = 300  # the head of a compile error or mismatch message; the rest is cut
INSTRUCTION = (
    "Goal: make kernel B faster while its outputs stay equal to the reference's. The next version will be written "
    "in {target}. Write ONE optimization suggestion for kernel B in at most three sentences: name the operation "
    "and the technique (for example operator fusion, tiling, shared memory, vectorized loads, removing redundant "
    "work). Do not write code."
)
# With `prompt_techniques`: what the implementer can do, like a tool description, so the suggestion is a choice among
# techniques that exist (the builtin implementer changes nothing for a suggestion that names none of them).
TECHNIQUES_SECTION = (
    "The implementer applies only these techniques, each only to kernels it fits (otherwise nothing changes):\n"
    "{lines}\n\n"
)
TECHNIQUE_LINE = '- {name}: {summary}. Example: "{example}"'
TECHNIQUE_INSTRUCTION = (
    "Goal: make kernel B faster while its outputs stay equal to the reference's. The next version will be written "
    "in {target}. Write ONE suggestion for kernel B in one sentence: choose the technique from the list that fits "
    "kernel B best and phrase it like its example. Do not write code."
)
CUT_MARKER = "\n# ... [{n} tokens cut] ...\n"


def describe_verdict(status: str, speedup: float | None, message: str) -> str:
    """Kernel B's verdict in one or two lines: the status, the speedup when correct, else the message's head."""
    message = " ".join(message.split())
    if len(message) > MESSAGE_HEAD_CHARS:
        message = message[:MESSAGE_HEAD_CHARS] + " ..."
    if status == "correct" and speedup is None:
        return "correct (not timed)."
    text = VERDICTS.get(status, status + ". {message}")
    return text.format(speedup=f"{speedup or 0.0:.2f}x", message=message).strip()


def technique_menu(vocabulary: Sequence[Mapping[str, Any]]) -> str:
    """The implementer's techniques, one line each (name, what it does, a phrasing it recognises), from the
    vocabulary it publishes in GET /health."""
    lines = [
        TECHNIQUE_LINE.format(name=t["name"], summary=str(t["summary"]).rstrip("."), example=t["example"])
        for t in vocabulary
    ]
    return TECHNIQUES_SECTION.format(lines="\n".join(lines))


def _user_text(kernel_a: str | None, suggestion: str, kernel_b: str, target: str, verdict: str, techniques: str) -> str:
    text = KERNEL_A_SAME if kernel_a is None else KERNEL_A_SECTION.format(kernel=kernel_a)
    text += SUGGESTION_SECTION.format(suggestion=suggestion.strip()) if suggestion.strip() else NO_SUGGESTION
    text += KERNEL_B_SECTION.format(kernel=kernel_b)
    text += VERDICT_SECTION.format(verdict=verdict) if verdict else ""
    if techniques:
        return text + techniques + TECHNIQUE_INSTRUCTION.format(target=TARGET_WORDS[target])
    return text + INSTRUCTION.format(target=TARGET_WORDS[target])


def _render(tokenizer: Any, user: str) -> list[int]:
    messages = [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": user}]
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=False)
    return list(ids["input_ids"] if isinstance(ids, dict) else ids)


def _cut_middle(tokenizer: Any, text: str, keep_tokens: int) -> str:
    """Keep the first and last keep_tokens/2 tokens of text, marking the cut."""
    ids = tokenizer.encode(text, add_special_tokens=False)
    if len(ids) <= keep_tokens:
        return text
    if keep_tokens <= 0:
        return CUT_MARKER.format(n=len(ids)).strip()
    head, tail = keep_tokens - keep_tokens // 2, keep_tokens // 2
    cut = CUT_MARKER.format(n=len(ids) - keep_tokens)
    return tokenizer.decode(ids[:head]) + cut + (tokenizer.decode(ids[-tail:]) if tail else "")


def build_prompt(
    tokenizer: Any,
    kernel_a: str,
    suggestion: str,
    kernel_b: str,
    target: str,
    max_tokens: int,
    *,
    verdict: str = "",
    techniques: str = "",
) -> list[int]:
    """Chat-templated prompt ids showing A, the last suggestion, B and B's verdict (and the implementer's technique
    menu, when given), within max_tokens.

    The instruction, the menu, the verdict (a bounded head) and the template are never cut. Kernel A gives way
    first; kernel B is cut (head and tail kept) only when it alone does not fit. A equal to B is shown once.
    """
    a = None if kernel_a == kernel_b else kernel_a
    ids = _render(tokenizer, _user_text(a, suggestion, kernel_b, target, verdict, techniques))
    if len(ids) <= max_tokens:
        return ids
    empty_a = None if a is None else ""
    overhead = len(_render(tokenizer, _user_text(empty_a, suggestion, "", target, verdict, techniques)))
    budget = max_tokens - overhead
    if budget <= 0:
        raise ValueError(f"max_prompt_tokens {max_tokens} cannot hold the instruction ({overhead} tokens)")
    b_len = len(tokenizer.encode(kernel_b, add_special_tokens=False))
    for slack in (8, 32, 128, budget):  # re-tokenising joined text can differ by a few tokens at the seams
        keep_b = min(b_len, budget - slack)
        keep_a = budget - slack - keep_b
        new_a = None if a is None else _cut_middle(tokenizer, a, keep_a)
        cut_b = _cut_middle(tokenizer, kernel_b, keep_b)
        ids = _render(tokenizer, _user_text(new_a, suggestion, cut_b, target, verdict, techniques))
        if len(ids) <= max_tokens:
            return ids
    raise ValueError(f"could not fit the prompt into {max_tokens} tokens")


def fixed_prompt_tokens(tokenizer: Any, target: str, techniques: str, suggestion_tokens: int) -> int:
    """Tokens of the parts of a prompt that are never cut, at their longest: the template, the instruction, the menu,
    a verdict with a full message head and a previous suggestion of `suggestion_tokens` tokens (kernels empty)."""
    suggestion = tokenizer.decode([tokenizer.encode(" x", add_special_tokens=False)[0]] * suggestion_tokens)
    verdict = describe_verdict("compile_error", None, "kernel.cu(12): error: 'y' is undefined; " * 20)
    return len(_render(tokenizer, _user_text("", suggestion, "", target, verdict, techniques)))
