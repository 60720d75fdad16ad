"""Log-probs of exactly the sampled ids under exactly the generation prompt: our training forward on the rebuilt
layout equals what `generate` sampled from, for left-padded prompts of different lengths."""

from __future__ import annotations

import pytest
import torch

from services.trainer.config import TrainConfig
from services.trainer.policy import Policy, left_pad, load_policy, make_batch, tiny_smollm2_config


@pytest.fixture(scope="module")
def policy():
    torch.manual_seed(0)
    config = TrainConfig(model="random:smollm2-tiny", max_new_tokens=8, max_prompt_tokens=512, top_p=1.0)
    return load_policy(config, torch.device("cpu"))


def test_logprobs_equal_the_sampling_distribution(policy):
    from transformers import GenerationConfig

    prompts = [[5, 6, 7, 8, 9, 10, 11], [12, 13, 14], [15, 16, 17, 18, 19]]  # unequal: left padding matters
    ids, mask = left_pad(prompts, policy.tokenizer.pad_token_id)
    config = GenerationConfig(
        do_sample=True,
        temperature=0.7,
        top_k=0,
        top_p=1.0,
        max_new_tokens=6,
        pad_token_id=policy.tokenizer.pad_token_id,
        eos_token_id=policy.eos_ids,
        output_logits=True,
        return_dict_in_generate=True,
    )
    with torch.no_grad():
        out = policy.model.generate(input_ids=ids, attention_mask=mask, generation_config=config)
    completions = out.sequences[:, ids.shape[1] :]
    sampled = torch.log_softmax(torch.stack(out.logits, 1).float() / 0.7, -1).gather(-1, completions[..., None])[..., 0]
    batch = make_batch(prompts, completions.tolist(), policy.tokenizer.pad_token_id, torch.device("cpu"))
    with torch.no_grad():
        ours, entropy = policy.logprobs(batch, with_entropy=True)
    assert torch.allclose(ours, sampled, atol=1e-4)
    assert entropy is not None and entropy.shape == ours.shape


def test_generate_stops_at_eos_and_reference_equals_policy_at_start(policy):
    results = policy.generate([[5, 6, 7], [8, 9]])
    for ids, text, finished in results:
        assert 1 <= len(ids) <= 8 and isinstance(text, str)
        assert finished == (ids[-1] in policy.eos_ids)
        assert all(token not in policy.eos_ids for token in ids[:-1])
    batch = make_batch([[5, 6, 7], [8, 9]], [r[0] for r in results], policy.tokenizer.pad_token_id, torch.device("cpu"))
    with torch.no_grad():
        assert torch.equal(policy.logprobs(batch)[0], policy.reference_logprobs(batch))  # LoRA B starts at 0


def test_full_fine_tune_keeps_a_frozen_reference(tokenizer):
    from transformers import AutoModelForCausalLM

    config = TrainConfig(model="random:smollm2-tiny", use_lora=False, max_new_tokens=8, max_prompt_tokens=512)
    model = AutoModelForCausalLM.from_config(tiny_smollm2_config(len(tokenizer), 1, 2))
    reference = AutoModelForCausalLM.from_config(tiny_smollm2_config(len(tokenizer), 1, 2))
    reference.load_state_dict(model.state_dict())
    policy = Policy(config, torch.device("cpu"), model, tokenizer, reference.requires_grad_(False))
    batch = make_batch([[5, 6, 7]], [[8, 9, 2]], tokenizer.pad_token_id, torch.device("cpu"))
    with torch.no_grad():
        next(model.parameters()).add_(0.5)  # the policy moves; the reference must not
        assert not torch.equal(policy.logprobs(batch)[0], policy.reference_logprobs(batch))


def test_a_stop_request_ends_generation_early(policy):
    results = policy.generate([[5, 6, 7], [8, 9]], should_stop=lambda: True)
    assert [len(ids) for ids, _, _ in results] == [1, 1]


def test_optimise_reports_progress(policy, monkeypatch, caplog):
    import logging

    from services.trainer import grpo
    from services.trainer.episodes import Turn

    monkeypatch.setattr(grpo, "PROGRESS_EVERY_S", 0.0)
    config = TrainConfig(model="random:smollm2-tiny", max_new_tokens=8, max_prompt_tokens=512, ppo_epochs=1, beta=0.0)
    samples = [Turn("p", 0, i, 0, [5, 6, 7], [8, 9], "s", True, advantage=1.0 if i % 2 else -1.0) for i in range(4)]
    optimizer = torch.optim.AdamW([p for p in policy.model.parameters() if p.requires_grad], lr=1e-4)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda _: 1.0)
    with caplog.at_level(logging.INFO, logger="services.trainer.grpo"):
        stats = grpo.optimise(policy, samples, config, optimizer, scheduler, None, torch.Generator().manual_seed(0))
    assert "losses/loss" in stats
    assert any("optimising: epoch 1/1, step 1/" in r.getMessage() for r in caplog.records)


def test_the_models_own_generation_config_does_not_change_sampling():
    """Qwen2 Instruct checkpoints ship a repetition_penalty (1.05-1.1): transformers takes every generation field the
    call leaves unset from the model's generation_config, so such a penalty would shape the sampled tokens (over the
    prompt's code too) while training takes log-probs of plain softmax(logits / T). The scores the sampler drew
    from must equal our log-probs."""
    torch.manual_seed(0)
    config = TrainConfig(model="random:smollm2-tiny", max_new_tokens=6, max_prompt_tokens=512, top_p=1.0)
    policy = load_policy(config, torch.device("cpu"))
    base = policy.model.get_base_model()
    base.generation_config.repetition_penalty = 1.1
    base.generation_config.no_repeat_ngram_size = 2
    captured = {}
    generate = policy.model.generate

    def generate_with_scores(*args, generation_config, **kwargs):
        generation_config = generation_config.__class__(**generation_config.to_dict())
        generation_config.output_scores = generation_config.return_dict_in_generate = True
        out = generate(*args, generation_config=generation_config, **kwargs)
        captured["scores"] = out.scores  # after the logits processors: what was sampled from
        return out.sequences

    policy.model.generate = generate_with_scores
    prompts = [[5, 6, 7, 5, 6, 7, 5], [8, 8, 8], [9, 10, 9, 10, 9]]  # repeated tokens: penalties would bite
    completions = [ids for ids, _, _ in policy.generate(prompts)]
    batch = make_batch(prompts, completions, policy.tokenizer.pad_token_id, torch.device("cpu"))
    width = batch.completion_ids.shape[1]
    sampled = torch.stack(captured["scores"], 1)[:, :width].float().log_softmax(-1)  # every token, every step
    with torch.no_grad():
        out = policy.model(
            input_ids=batch.input_ids, attention_mask=batch.attention_mask, position_ids=batch.position_ids
        )
        trained = (out.logits[:, -width - 1 : -1].float() / config.temperature).log_softmax(-1)
        picked = policy.logprobs(batch)[0]
    valid = batch.completion_mask.bool()
    assert torch.allclose(sampled[valid], trained[valid], atol=1e-4)  # the whole distribution, not one token
    assert torch.allclose(picked[valid], trained[valid].gather(-1, batch.completion_ids[valid][:, None])[:, 0])
    assert base.generation_config.repetition_penalty == 1.1  # the model's own config is back after sampling


def test_old_logprobs_come_from_the_batches_trained_on(monkeypatch):
    """In bf16 a sample's log-probs depend on how its mini-batch is padded: the old log-probs must be taken of the
    same mini-batches as the training forward, so that without a weight change every ratio is exactly 1."""
    from services.trainer import grpo
    from services.trainer.episodes import Turn

    torch.manual_seed(0)
    config = TrainConfig(
        model="random:smollm2-tiny", max_prompt_tokens=512, dtype="bfloat16", mini_batch_size=4, beta=0.0
    )
    bf16 = load_policy(config, torch.device("cpu"))
    g = torch.Generator().manual_seed(1)

    def ids(low: int, high: int) -> list[int]:  # random tokens, of a random length: every batch pads differently
        return torch.randint(5, 1000, (int(torch.randint(low, high, (1,), generator=g)),), generator=g).tolist()

    samples = [Turn("p", 0, i, 0, ids(5, 200), ids(2, 30), "s", True, advantage=1.0) for i in range(8)]
    deltas = []
    loss = grpo.grpo_loss

    def recording_loss(logps, old_logps, *args):
        deltas.append(((logps - old_logps).abs() * args[2]).max().item())  # args[2]: the completion mask
        return loss(logps, old_logps, *args)

    monkeypatch.setattr(grpo, "grpo_loss", recording_loss)
    optimizer = torch.optim.SGD([p for p in bf16.model.parameters() if p.requires_grad], lr=0.0)  # weights stay
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda _: 1.0)
    grpo.optimise(bf16, samples, config, optimizer, scheduler, None, torch.Generator().manual_seed(3))
    assert len(deltas) == 4 and max(deltas) == 0.0  # 2 epochs x 2 mini-batches
