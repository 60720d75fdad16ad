"""The compiled generation backend on CPU (its loop runs uncompiled here): the generation copy computes what the
LoRA-wrapped policy computes, sampling leaves every trained weight, gradient and optimizer state bitwise as it was,
tokens are drawn from the distribution the log-probs are taken of, and EOS and stop requests end generation."""

from __future__ import annotations

import pytest
import torch

from services.trainer.config import TrainConfig
from services.trainer.policy import left_pad, load_policy, make_batch
from services.trainer.sampling import GenerationCopy, StaticCacheSampler, resolve_generation_backend, sampling_scores

PROMPTS = [[5, 6, 7, 8, 9, 10, 11], [12, 13, 14], [15, 16, 17, 18, 19]]  # unequal: left padding matters


def trained_policy(dtype: str = "float32", **overrides):
    """A tiny LoRA policy whose adapters are not zero (a fresh LoRA B is, and would hide a wrong merge)."""
    torch.manual_seed(0)
    settings = {"max_new_tokens": 8, "max_prompt_tokens": 512, "generation_backend": "compiled", **overrides}
    config = TrainConfig(model="random:smollm2-tiny", dtype=dtype, **settings)
    policy = load_policy(config, torch.device("cpu"))
    with torch.no_grad():
        for name, param in policy.model.named_parameters():
            if "lora_B" in name:
                param.normal_(0, 0.05)
    return policy


def policy_logits(policy, prompts):
    ids, mask = left_pad(prompts, policy.tokenizer.pad_token_id)
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    with torch.no_grad():
        lora = policy.model(input_ids=ids, attention_mask=mask, position_ids=positions).logits.float()
        merged = policy.generation_copy.model(input_ids=ids, attention_mask=mask, position_ids=positions)
    return lora, merged.logits.float(), mask.bool()


def test_generation_backend_resolves_as_documented():
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert resolve_generation_backend("auto", cpu) == "hf"
    assert resolve_generation_backend("auto", cuda) == "compiled"
    assert resolve_generation_backend("hf", cuda) == "hf"
    assert resolve_generation_backend("compiled", cpu) == "compiled"
    assert TrainConfig().generation_backend == "auto"
    with pytest.raises(ValueError, match="generation_backend"):
        TrainConfig(generation_backend="vllm")


def test_generation_copy_computes_what_the_lora_model_computes():
    policy = trained_policy()
    policy.generation_copy = GenerationCopy(policy.model, torch.float32, torch.device("cpu"))
    lora, merged, valid = policy_logits(policy, PROMPTS)
    without_adapters = policy.model.get_base_model()
    with policy.model.disable_adapter(), torch.no_grad():
        ids, mask = left_pad(PROMPTS, policy.tokenizer.pad_token_id)
        base = without_adapters(input_ids=ids, attention_mask=mask).logits.float()
    assert (lora[valid] - base[valid]).abs().max() > 1e-2  # the adapters matter here
    assert torch.allclose(merged[valid], lora[valid], atol=1e-5)
    with torch.no_grad():  # the policy moves; refresh() carries the move over
        next(p for n, p in policy.model.named_parameters() if "lora_A" in n).add_(0.1)
    moved, stale, _ = policy_logits(policy, PROMPTS)
    assert not torch.allclose(stale[valid], moved[valid], atol=1e-3)
    policy.generation_copy.refresh()
    assert torch.allclose(policy_logits(policy, PROMPTS)[1][valid], moved[valid], atol=1e-5)


def test_generation_copy_in_bfloat16_shares_the_frozen_weights_and_rounds_once():
    policy = trained_policy("bfloat16")
    copy = GenerationCopy(policy.model, torch.bfloat16, torch.device("cpu"))
    policy.generation_copy = copy
    lora, merged, valid = policy_logits(policy, PROMPTS)
    assert (merged[valid] - lora[valid]).abs().max() < 0.05 * lora[valid].abs().max()  # bf16 rounding only
    base = policy.model.get_base_model()
    assert copy.model.model.embed_tokens.weight is base.model.embed_tokens.weight  # frozen, no adapter: shared
    assert copy.model.lm_head.weight is copy.model.model.embed_tokens.weight  # still tied
    q_proj = base.model.layers[0].self_attn.q_proj
    expected = q_proj.base_layer.weight.float() + q_proj.get_delta_weight("default").float()
    assert torch.equal(copy.model.model.layers[0].self_attn.q_proj.weight, expected.to(torch.bfloat16))
    assert q_proj.base_layer.weight is not copy.model.model.layers[0].self_attn.q_proj.weight


def test_sampling_leaves_trained_weights_gradients_and_optimizer_state_bitwise_unchanged():
    policy = trained_policy("bfloat16")
    trainable = [p for p in policy.model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trainable, lr=1e-3)
    batch = make_batch(PROMPTS, [[20, 21], [22], [23, 24, 25]], policy.tokenizer.pad_token_id, torch.device("cpu"))
    policy.logprobs(batch)[0].sum().backward()
    optimizer.step()  # optimizer state exists, gradients are set
    weights = {n: p.detach().clone() for n, p in policy.model.named_parameters()}
    grads = {n: p.grad.clone() for n, p in policy.model.named_parameters() if p.grad is not None}
    state = [{k: v.clone() for k, v in optimizer.state[p].items()} for p in trainable]
    flags = {n: p.requires_grad for n, p in policy.model.named_parameters()}
    for _ in range(2):  # the first call builds the copy, the second refreshes it
        policy.generate(PROMPTS)
    assert all(torch.equal(p, weights[n]) for n, p in policy.model.named_parameters())
    assert all(torch.equal(p.grad, grads[n]) for n, p in policy.model.named_parameters() if n in grads)
    assert all(
        torch.equal(v, before[k])
        for p, before in zip(trainable, state, strict=True)
        for k, v in optimizer.state[p].items()
    )
    assert flags == {n: p.requires_grad for n, p in policy.model.named_parameters()}
    assert not any(p.requires_grad for p in policy.generation_copy.model.parameters())
    assert policy.model.training  # training goes on in train mode


def test_compiled_sampling_draws_from_the_trained_distribution(drawn_from):
    """The logits every token was drawn from equal the training forward's over the sampled sequence (the KV cache,
    positions and padding line up), and the draw is softmax(logits / T) cut exactly as transformers cuts it."""
    from transformers import TemperatureLogitsWarper, TopPLogitsWarper

    policy = trained_policy()
    completions = [ids for ids, _, _ in policy.generate(PROMPTS)]
    batch = make_batch(PROMPTS, completions, policy.tokenizer.pad_token_id, torch.device("cpu"))
    width = batch.completion_ids.shape[1]
    with torch.no_grad():
        out = policy.model(
            input_ids=batch.input_ids, attention_mask=batch.attention_mask, position_ids=batch.position_ids
        )
    trained = out.logits[:, -width - 1 : -1].float()
    valid = batch.completion_mask.bool()
    assert torch.allclose(torch.stack(drawn_from, 1)[:, :width][valid], trained[valid], atol=1e-4)

    logits = drawn_from[0]
    for top_p in (1.0, 0.9, 0.3):
        theirs = TopPLogitsWarper(top_p)(None, TemperatureLogitsWarper(0.7)(None, logits.clone()))
        assert torch.equal(sampling_scores(logits, 0.7, top_p), theirs)
    assert sampling_scores(logits, 0.7, 0.3).isinf().any()  # the nucleus cut something


def test_compiled_sampling_ends_rows_at_eos_and_stops_early():
    policy = trained_policy(max_new_tokens=40)
    copy = GenerationCopy(policy.model, torch.float32, torch.device("cpu"))
    sampler = StaticCacheSampler(copy.model, compile=False)
    ids, mask = left_pad(PROMPTS, policy.tokenizer.pad_token_id)
    vocab = copy.model.config.vocab_size
    eos_ids = list(range(vocab // 10, vocab))  # 90 % of the vocabulary ends a row: every row ends within a few steps
    pad = policy.tokenizer.pad_token_id
    torch.manual_seed(1)
    tokens = sampler.sample(ids, mask, 40, 0.7, 1.0, eos_ids, pad)
    assert tokens.shape[1] < 40  # all rows ended, the loop stopped before the limit
    for row in tokens.tolist():
        first_eos = next(i for i, t in enumerate(row) if t in eos_ids)
        assert all(t == pad for t in row[first_eos + 1 :])


def test_compiled_backend_respects_eos_and_stop_requests():
    policy = trained_policy()
    for ids, text, finished in policy.generate(PROMPTS):
        assert 1 <= len(ids) <= 8 and isinstance(text, str)
        assert finished == (ids[-1] in policy.eos_ids)
        assert all(token not in policy.eos_ids for token in ids[:-1])
    assert [len(ids) for ids, _, _ in policy.generate(PROMPTS, should_stop=lambda: True)] == [1, 1, 1]
