"""Prompt text of the openai backend, as named constants next to the code that fills them in."""

from __future__ import annotations

from typing import TYPE_CHECKING

from shared.contracts import Target

if TYPE_CHECKING:  # the types only; the builtin backend runs without the openai SDK loaded
    from openai.types.chat import ChatCompletionMessageParam

SYSTEM_PROMPT = """You are an expert GPU kernel engineer. You rewrite PyTorch modules into faster ones.

The KernelBench contract you must follow:
- Return ONE complete, self-contained Python module in ONE ```python code block, and nothing after it.
- The module defines `class ModelNew(torch.nn.Module)` whose constructor takes exactly the same arguments as the
  reference `Model`, and whose `forward` takes the same inputs and returns the same outputs (same shapes, dtypes,
  values within floating-point tolerance).
- Do not import, subclass or call the reference `Model`; do not mutate the inputs; do not cache outputs.
- Keep the module interface (imports at the top, `ModelNew`, helper functions it needs)."""

TARGET_RULES: dict[Target, str] = {
    "cuda": "Write the custom kernels in CUDA C++ and build them with torch.utils.cpp_extension.load_inline.",
    "triton": "Write the custom kernels in Triton (@triton.jit) and launch them from ModelNew.forward.",
    "torch": "Use PyTorch operations only (no custom CUDA or Triton kernels).",
}

USER_PROMPT = """Target: {target}. {target_rule}

The reference module (the problem; outputs must match it):
```python
{reference_source}
```

The current kernel (start from this one and keep what already works):
```python
{current_source}
```

Implement this optimization suggestion:
{suggestion}

Reply with the complete new module defining `ModelNew` in one ```python code block."""

REPAIR_PROMPT = """Your reply could not be used: {error}
Reply again with the complete module defining `class ModelNew`, in one ```python code block, and nothing else."""


def build_messages(
    *, reference_source: str, current_source: str, suggestion: str, target: Target
) -> list[ChatCompletionMessageParam]:
    """The chat messages of the first call."""
    user = USER_PROMPT.format(
        target=target,
        target_rule=TARGET_RULES[target],
        reference_source=reference_source.strip(),
        current_source=current_source.strip(),
        suggestion=suggestion.strip(),
    )
    return [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": user}]


def repair_messages(
    messages: list[ChatCompletionMessageParam], reply: str, error: str
) -> list[ChatCompletionMessageParam]:
    """The conversation plus the faulty reply and the reason it was refused."""
    return [
        *messages,
        {"role": "assistant", "content": reply},
        {"role": "user", "content": REPAIR_PROMPT.format(error=error)},
    ]
