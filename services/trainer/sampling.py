"""Sampling at GPU speed: a generation copy of the policy with its LoRA merged into the weights, a static KV cache,
and a decode step compiled with CUDA graphs (`generation_backend: compiled`).

HF `generate` on the peft model runs every adapter as two extra matmuls and launches each of the decode step's
~1,000 kernels from Python. Here the adapters are merged (W + scale * B @ A, summed in float32 and rounded once)
into a plain transformers model that exists only for sampling, so the trained model's weights, adapters,
gradients and optimizer state are never touched and nothing needs restoring; its merged tensors are refreshed in
place before every call, so a compiled graph keeps reading the same addresses. The cache has one fixed size per
batch (grown in steps of `CACHE_LENGTH_STEP`, never shrunk), so the decode step sees the same shapes call after
call and is compiled once.

Sampling is exactly what the log-probs are taken of: softmax(logits / temperature), then top-p as transformers'
TopPLogitsWarper does it, no other processor.
"""

from __future__ import annotations

import copy
import inspect
from collections.abc import Callable
from typing import Any, Literal

import torch

CACHE_LENGTH_STEP = 256  # cache sizes are multiples of this: few distinct shapes, each compiled once
STOP_CHECK_EVERY = 8  # decode steps between checks that every row ended (each check waits for the GPU)


def resolve_generation_backend(backend: str, device: torch.device) -> Literal["hf", "compiled"]:
    """`auto` is `compiled` on CUDA and `hf` elsewhere (the compiled step needs CUDA graphs to pay off)."""
    if backend == "auto":
        return "compiled" if device.type == "cuda" else "hf"
    if backend not in ("hf", "compiled"):
        raise ValueError(f"unknown generation backend {backend!r}")
    return "compiled" if backend == "compiled" else "hf"


def effective_weights(model: Any) -> dict[str, tuple[torch.Tensor, list[tuple[Any, str]]]]:
    """The weights the model computes with, by the plain transformers model's parameter names: each name's base
    tensor and the (LoRA layer, adapter) pairs whose delta adds to it (none outside LoRA layers)."""
    from peft.tuners.lora import LoraLayer

    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    lora_layers = {name: module for name, module in base.named_modules() if isinstance(module, LoraLayer)}
    weights: dict[str, tuple[torch.Tensor, list[tuple[Any, str]]]] = {}
    for name, param in base.named_parameters(remove_duplicate=False):
        if ".lora_" in name:
            continue
        plain = name.replace(".base_layer.", ".")
        layer_name, _, leaf = plain.rpartition(".")
        layer = lora_layers.get(layer_name)
        adapters = (
            [(layer, a) for a in layer.active_adapters if a in layer.lora_A and not layer.merged]
            if layer is not None and leaf == "weight"
            else []
        )
        weights[plain] = (param, adapters)
    return weights


class GenerationCopy:
    """A plain transformers model computing what the (LoRA-wrapped) policy computes, in `dtype`, for sampling.

    Parameters the policy never changes (frozen, already in `dtype`, no adapter on them) are the policy's own
    tensors; every other one is a tensor of its own, rewritten by `refresh()` from the policy's current weights."""

    def __init__(self, policy_model: Any, dtype: torch.dtype, device: torch.device) -> None:
        from transformers import AutoModelForCausalLM

        base = policy_model.get_base_model() if hasattr(policy_model, "get_base_model") else policy_model
        config = copy.deepcopy(base.config)
        config.use_cache = True
        with torch.device(device):  # initialised where it runs (the .to() is a no-op then)
            self.model = AutoModelForCausalLM.from_config(config, dtype=dtype, attn_implementation="sdpa")
        self.model.to(device).requires_grad_(False).eval()
        sources = effective_weights(policy_model)
        own = dict(self.model.named_parameters(remove_duplicate=False))
        if set(own) != set(sources):
            raise ValueError(f"generation copy and policy differ in parameters: {sorted(set(own) ^ set(sources))}")
        self.refreshed: list[tuple[torch.Tensor, torch.Tensor, list[tuple[Any, str]]]] = []
        for name, (source, adapters) in sources.items():
            target = own[name]
            if not adapters and not source.requires_grad and (source.dtype, source.device) == (dtype, target.device):
                module_name, _, leaf = name.rpartition(".")
                setattr(self.model.get_submodule(module_name), leaf, source)  # shared: tied weights stay tied
            else:
                self.refreshed.append((target, source, adapters))
        self.refresh()

    @torch.no_grad()
    def refresh(self) -> None:
        """Copy the policy's current weights in, each LoRA delta summed in float32 and rounded once."""
        for target, source, adapters in self.refreshed:
            if adapters:
                merged = source.float() + sum(layer.get_delta_weight(a).float() for layer, a in adapters)
                target.copy_(merged)
            else:
                target.copy_(source)


def sampling_scores(logits: torch.Tensor, temperature: float, top_p: float) -> torch.Tensor:
    """What a token is drawn from, as transformers' TemperatureLogitsWarper then TopPLogitsWarper make it:
    float32 logits / temperature, -inf outside the top-p nucleus (the most likely token always kept)."""
    scores = logits.float() / temperature
    if top_p < 1.0:
        sorted_scores, order = torch.sort(scores, descending=False)
        cumulative = sorted_scores.softmax(dim=-1).cumsum(dim=-1)
        drop_sorted = cumulative <= (1 - top_p)
        drop_sorted[..., -1:] = False
        scores = scores.masked_fill(drop_sorted.scatter(1, order, drop_sorted), -float("inf"))
    return scores


def sample_next_token(logits: torch.Tensor, temperature: float, top_p: float) -> torch.Tensor:
    """One token per row of (batch, vocab) logits."""
    return torch.multinomial(sampling_scores(logits, temperature, top_p).softmax(dim=-1), num_samples=1)[:, 0]


class StaticCacheSampler:
    """Left-padded prompts -> sampled tokens, with a static KV cache; the one-token decode step is compiled
    (torch.compile, CUDA graphs) when `compile` is set. The prompt's prefill runs uncompiled, once per call."""

    def __init__(self, model: Any, compile: bool) -> None:
        self.model = model
        # transformers renamed the forward's `past_key_values` to `cache` (5.2x); pass whichever this one takes
        params = inspect.signature(model.forward).parameters
        self.cache_kwarg = "cache" if "cache" in params else "past_key_values"
        self.decode = torch.compile(model.forward, mode="reduce-overhead") if compile else model.forward
        self.compiled = compile
        self.cache: Any = None
        self.cache_shape = (0, 0)

    def _cache_for(self, batch: int, length: int) -> Any:
        """The cache, reset; a new one only for another batch size or a longer sequence than it holds."""
        from transformers import StaticCache

        if self.cache is None or self.cache_shape[0] != batch or self.cache_shape[1] < length:
            size = -(-length // CACHE_LENGTH_STEP) * CACHE_LENGTH_STEP
            self.cache = StaticCache(config=self.model.config, max_cache_len=size)
            self.cache_shape = (batch, size)
        else:
            self.cache.reset()
        return self.cache

    @torch.no_grad()
    def sample(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        max_new_tokens: int,
        temperature: float,
        top_p: float,
        eos_ids: list[int],
        pad_id: int,
        should_stop: Callable[[], bool] | None = None,
    ) -> torch.Tensor:
        """New tokens (batch, n <= max_new_tokens), `pad_id` after a row's EOS; ends early when every row has
        ended (checked every STOP_CHECK_EVERY steps) or when `should_stop()` says so after a step."""
        batch, width = input_ids.shape
        device = input_ids.device
        cache = self._cache_for(batch, width + max_new_tokens)
        # One mask of the cache's full width for the whole call: prompt padding 0, every later slot 1 (the causal
        # mask keeps a query off the slots not written yet), so the decode step's inputs never change shape.
        mask = torch.ones(batch, self.cache_shape[1], dtype=attention_mask.dtype, device=device)
        mask[:, :width] = attention_mask
        positions = (attention_mask.cumsum(-1) - 1).clamp(min=0)  # real tokens only, as in training
        next_position = positions[:, -1:] + 1
        eos = torch.tensor(eos_ids, device=device)
        out = self.model(
            input_ids=input_ids,
            attention_mask=mask,
            position_ids=positions,
            use_cache=True,
            logits_to_keep=1,
            **{self.cache_kwarg: cache},
        )
        tokens = sample_next_token(out.logits[:, -1], temperature, top_p)
        ended = torch.isin(tokens, eos)
        generated = [tokens]
        for step in range(1, max_new_tokens):
            if should_stop and should_stop():
                break
            if step % STOP_CHECK_EVERY == 0 and bool(ended.all()):
                break
            if self.compiled:
                torch.compiler.cudagraph_mark_step_begin()  # the previous step's logits are consumed
            out = self.decode(
                input_ids=tokens[:, None],
                attention_mask=mask,
                position_ids=next_position,
                use_cache=True,
                **{self.cache_kwarg: cache},
            )
            tokens = sample_next_token(out.logits[:, -1], temperature, top_p)
            tokens = tokens.masked_fill(ended, pad_id)
            ended |= torch.isin(tokens, eos)
            generated.append(tokens)
            next_position = next_position + 1
        return torch.stack(generated, dim=1)
