"""Prompt building with the SmolLM2 tokenizer: the instruction and kernel B survive truncation, A gives way first."""

from __future__ import annotations

from services.trainer.prompts import (
    INSTRUCTION,
    REFERENCE_VERDICT,
    TARGET_WORDS,
    TECHNIQUE_INSTRUCTION,
    build_prompt,
    describe_verdict,
    technique_menu,
)

KERNEL_B = (
    "import torch\n\nclass ModelNew(torch.nn.Module):\n    def forward(self, x):\n        return x * 2  # B_MARK\n"
)


def _text(tokenizer, ids):
    return tokenizer.decode(ids)


def test_short_prompt_is_whole(tokenizer):
    ids = build_prompt(tokenizer, "A_MARK = 1\n", "fuse the two multiplies", KERNEL_B, "cuda", 1024)
    text = _text(tokenizer, ids)
    for part in ("A_MARK", "fuse the two multiplies", "B_MARK", INSTRUCTION.format(target=TARGET_WORDS["cuda"])):
        assert part in text
    assert text.rstrip().endswith("assistant")  # the generation prompt of the chat template


def test_first_turn_shows_the_reference_once(tokenizer):
    text = _text(tokenizer, build_prompt(tokenizer, KERNEL_B, "", KERNEL_B, "triton", 1024))
    assert text.count("B_MARK") == 1
    assert "none yet" in text and "Triton" in text


def test_long_kernel_a_is_cut_and_b_survives(tokenizer):
    kernel_a = "".join(f"a_{i} = torch.relu(x) * {i}\n" for i in range(2000))
    ids = build_prompt(tokenizer, kernel_a, "use shared memory", KERNEL_B, "cuda", 600)
    text = _text(tokenizer, ids)
    assert len(ids) <= 600
    assert "B_MARK" in text and "tokens cut" in text and "use shared memory" in text
    assert INSTRUCTION.format(target=TARGET_WORDS["cuda"]) in text
    assert "a_0 =" in text and "a_1999 =" in text  # head and tail of A kept


def test_huge_kernel_b_is_cut_but_the_instruction_survives(tokenizer):
    kernel_b = KERNEL_B + "".join(f"b_{i} = x + {i}\n" for i in range(3000)) + "# B_TAIL\n"
    ids = build_prompt(tokenizer, "A_MARK = 1\n", "tile it", kernel_b, "cuda", 700)
    text = _text(tokenizer, ids)
    assert len(ids) <= 700
    assert "A_MARK" not in text  # A went first
    assert "class ModelNew" in text and "B_TAIL" in text
    assert INSTRUCTION.format(target=TARGET_WORDS["cuda"]) in text


def test_kernel_bs_verdict_is_shown_and_survives_truncation(tokenizer):
    error = "error: identifier 'blockDim_x' is undefined " + "x" * 1000
    verdict = describe_verdict("compile_error", None, error)
    assert verdict.startswith("it does not compile. error: identifier 'blockDim_x' is undefined")
    assert len(verdict) < 400 and verdict.endswith("...")  # the head of the message only
    kernel_b = KERNEL_B + "".join(f"b_{i} = x + {i}\n" for i in range(3000))
    text = _text(tokenizer, build_prompt(tokenizer, "A_MARK = 1\n", "tile it", kernel_b, "cuda", 900, verdict=verdict))
    assert "Kernel B's evaluation: it does not compile. error: identifier 'blockDim_x'" in text
    assert INSTRUCTION.format(target=TARGET_WORDS["cuda"]) in text


def test_verdict_texts():
    assert describe_verdict("correct", 1.234, "") == "correct, 1.23x the reference's speed."
    assert describe_verdict("correct", None, "") == "correct (not timed)."
    assert describe_verdict("incorrect", None, "max abs error 0.5 > atol 1e-4").endswith("atol 1e-4")
    assert "reference" in REFERENCE_VERDICT  # the first turn's B


def _builtin_health():
    from services.implementer.backends.builtin import BuiltinBackend
    from shared.contracts import HealthResponse

    return HealthResponse(service="implementer", version="test", details=BuiltinBackend().describe())


def test_the_technique_menu_comes_from_the_implementers_own_catalogue(tokenizer):
    from services.implementer.rules import TECHNIQUES
    from services.trainer.episodes import published_vocabulary

    menu = technique_menu(published_vocabulary({"http://i": _builtin_health()}, ["http://i"]))
    for technique in TECHNIQUES:  # every technique the implementer has, one line each, with a phrasing it knows
        assert f'- {technique.name}: {technique.summary.rstrip(".")}. Example: "{technique.example}"' in menu
    assert menu.count("\n- ") == len(TECHNIQUES)
    kernel_b = KERNEL_B + "".join(f"b_{i} = x + {i}\n" for i in range(3000))
    ids = build_prompt(tokenizer, "A_MARK = 1\n", "tile it", kernel_b, "cuda", 1500, techniques=menu)
    text = _text(tokenizer, ids)
    assert len(ids) <= 1500 and menu.strip() in text  # never cut, B gives way
    assert TECHNIQUE_INSTRUCTION.format(target=TARGET_WORDS["cuda"]) in text and "tiling, shared memory" not in text


def test_an_implementer_without_a_catalogue_is_refused_for_the_menu():
    import pytest

    from services.trainer.config import ConfigError
    from services.trainer.episodes import published_vocabulary
    from shared.contracts import HealthResponse

    llm = HealthResponse(service="implementer", version="test", details={"backend": "openai", "model": "gpt-4o"})
    with pytest.raises(ConfigError, match="implementer at http://llm .*prompt_techniques false"):
        published_vocabulary({"http://llm": llm}, ["http://llm"])
