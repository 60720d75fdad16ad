"""Prompt building with the SmolLM2 tokenizer: the instruction and kernel B survive truncation, A gives way first."""

from __future__ import annotations

from services.trainer.prompts import INSTRUCTION, REFERENCE_VERDICT, TARGET_WORDS, build_prompt, describe_verdict

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
