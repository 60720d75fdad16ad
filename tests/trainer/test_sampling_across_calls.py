"""The compiled generation backend over several calls, the weights moved between them as an optimizer step moves
them: every token is drawn from the logits the training forward computes, and the trained weights come out
bitwise unchanged. On CPU (uncompiled), and on a GPU with the decode step compiled with CUDA graphs
(`make test-gpu`; about a minute). A tiny Qwen2 with the benchmark's synthetic tokenizer: no model files needed."""

from __future__ import annotations

import pytest
import torch
from peft import LoraConfig, get_peft_model

from bench.trainer_gpu import TINY, build_model, synthetic_tokenizer
from services.trainer.config import TrainConfig
from services.trainer.policy import Policy, make_batch

GPU = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


@pytest.mark.parametrize(
    ("device_type", "dtype"),
    [
        ("cpu", "float32"),
        pytest.param("cuda", "float32", marks=GPU),
        pytest.param("cuda", "bfloat16", marks=GPU),
    ],
)
def test_compiled_sampling_follows_the_trained_weights(device_type, dtype, drawn_from):
    torch.manual_seed(0)
    device = torch.device(device_type)
    config = TrainConfig(
        model="random:qwen2-tiny", dtype=dtype, max_new_tokens=24, max_prompt_tokens=512, generation_backend="compiled"
    )
    with torch.device(device):
        model = build_model(TINY, getattr(torch, dtype), device, 0)
    model = get_peft_model(model, LoraConfig(r=8, lora_alpha=16, target_modules=list(config.lora_targets)))
    policy = Policy(config, device, model, synthetic_tokenizer(TINY["vocab_size"]))
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(3, TINY["vocab_size"], (n,), generator=g).tolist() for n in (40, 17, 33, 25)]
    lora_b = [p for n, p in policy.model.named_parameters() if "lora_B" in n]
    for call in range(3):
        with torch.no_grad():  # the policy moves between calls, as an optimizer step moves it
            for p in lora_b:
                p.add_(0.02 * torch.randn_like(p))
        weights = {n: p.detach().clone() for n, p in policy.model.named_parameters()}
        drawn_from.clear()
        completions = [ids for ids, _, _ in policy.generate(prompts)]
        assert all(torch.equal(p, weights[n]) for n, p in policy.model.named_parameters()), call
        batch = make_batch(prompts, completions, policy.tokenizer.pad_token_id, device)
        width = batch.completion_ids.shape[1]
        with torch.no_grad():
            out = policy.model(
                input_ids=batch.input_ids, attention_mask=batch.attention_mask, position_ids=batch.position_ids
            )
        trained = out.logits[:, -width - 1 : -1].float()
        valid = batch.completion_mask.bool()
        sampled = torch.stack(drawn_from, 1)[:, :width]
        error = (sampled[valid] - trained[valid]).abs().max().item()
        scale = trained[valid].abs().max().item()
        assert error <= (1e-3 if dtype == "float32" else 0.05) * max(scale, 1.0), (call, error, scale)
    assert policy.sampler is not None and policy.sampler.compiled == (device.type == "cuda")
