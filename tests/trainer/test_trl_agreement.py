"""On a single-turn batch (one group, one turn, so returns = rewards) our advantages and loss equal TRL's GRPO ones:
`sequence` normalisation vs loss_type="grpo", `token` vs loss_type="bnpo"."""

from __future__ import annotations

import pytest
import torch

from services.trainer.grpo import group_advantages, grpo_loss
from services.trainer.policy import make_batch, tiny_smollm2_config, token_logprobs

trl = pytest.importorskip("trl")


def _tiny_trainer(tmp_path, tokenizer, loss_type: str):
    from datasets import Dataset
    from transformers import AutoModelForCausalLM
    from trl import GRPOConfig, GRPOTrainer

    torch.manual_seed(0)
    tiny = AutoModelForCausalLM.from_config(
        tiny_smollm2_config(len(tokenizer), tokenizer.bos_token_id, tokenizer.eos_token_id)
    )
    tiny.save_pretrained(tmp_path / "tiny")  # TRL builds its reference model from the policy's path
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "tiny")
    args = GRPOConfig(
        output_dir=str(tmp_path / "out"),
        per_device_train_batch_size=4,
        num_generations=4,
        max_completion_length=6,
        temperature=0.7,
        beta=0.04,
        epsilon=0.2,
        loss_type=loss_type,
        report_to="none",
        use_cpu=True,
        logging_steps=1,
        bf16=False,
        use_bias_correction_kl=False,
    )  # fp32 as ours on CPU; plain k3 KL (DeepSeekMath)
    dataset = Dataset.from_dict({"prompt": ["a b c"] * 4})
    return GRPOTrainer(
        model=model,
        reward_funcs=lambda completions, **kw: [0.0] * len(completions),
        args=args,
        train_dataset=dataset,
        processing_class=tokenizer,
    )


@pytest.mark.parametrize(("loss_type", "ours"), [("grpo", "sequence"), ("bnpo", "token")])
def test_single_turn_loss_and_advantages_match_trl(tmp_path, tokenizer, loss_type, ours):
    from trl.trainer.utils import nanstd

    trainer = _tiny_trainer(tmp_path, tokenizer, loss_type)
    model = trainer.model.train()
    trainer.current_gradient_accumulation_steps = 1
    prompts = [[11, 12, 13, 14, 15]] * 4  # one prompt: the group; equal lengths, so no left padding
    completions = [[21, 22, 23, 2], [31, 32], [41, 42, 43, 44, 45, 2], [51]]
    rewards = torch.tensor([1.3, -1.0, -0.5, 2.1])
    ours_adv = torch.tensor(group_advantages(rewards.tolist(), [0, 0, 0, 0], scale_rewards=True))
    trl_adv = (rewards - rewards.mean()) / (nanstd(rewards) + 1e-4)  # TRL's group scaling
    assert torch.allclose(ours_adv, trl_adv, atol=1e-6)

    batch = make_batch(prompts, completions, tokenizer.pad_token_id, torch.device("cpu"))
    with torch.no_grad():
        logps, _ = token_logprobs(model, batch, 0.7)
    generator = torch.Generator().manual_seed(1)
    old = logps + 0.3 * torch.randn(logps.shape, generator=generator)  # ratios off 1, some clipped
    ref = logps + 0.2 * torch.randn(logps.shape, generator=generator)
    mask = batch.completion_mask
    inputs = {
        "prompt_ids": batch.input_ids[:, :5],
        "prompt_mask": batch.attention_mask[:, :5],
        "completion_ids": batch.completion_ids,
        "completion_mask": mask,
        "advantages": trl_adv,
        "old_per_token_logps": old,
        "ref_per_token_logps": ref,
        "num_items_in_batch": mask.sum(),
    }
    trl_loss = trainer._compute_loss(model, inputs)

    new_logps, _ = token_logprobs(model, batch, 0.7)
    normalizer = float(mask.sum()) if ours == "token" else 4.0
    our_loss, _ = grpo_loss(new_logps, old, ref, ours_adv, mask, 0.2, 0.2, 0.04, ours, normalizer)
    assert our_loss.item() == pytest.approx(trl_loss.item(), rel=1e-5, abs=1e-6)
    assert abs(our_loss.item()) > 1e-3  # a real, non-trivial value was compared
