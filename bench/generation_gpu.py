"""GPU benchmark of sampling alone, with the design's batch: 16 prompts of ~700 tokens (lengths 640-760, so left
padding matters), 256 new tokens each, Qwen2-0.5B's architecture with random weights and the trainer's LoRA, bf16.
Three samplers of the same model and batch, in one run:

- `hf`: `Policy.generate` with `generation_backend: hf` (transformers' generate on the peft model, dynamic cache);
- `compiled`: `Policy.generate` with `generation_backend: compiled` (LoRA merged into a generation copy, static KV
  cache, decode step compiled with CUDA graphs);
- `trl`: what TRL's GRPOTrainer calls to sample without vLLM: the model prepared by an `Accelerator` (bf16
  autocast), `trl.models.unwrap_model_for_generation` with the trainer's generation kwargs, and `generate` with
  `GenerationConfig(**kwargs, disable_compile=True)` (GRPOConfig's defaults: top_k 0, no min_p, no penalty).

Each sampler first makes an untimed call of WARMUP_TOKENS new tokens (`warmup_s`: for `compiled`, building the
generation copy and compiling the decode step). Random weights write EOS with a probability of about 1/150,000 per token, so every row runs to the limit; the
throughput counts rows x steps run (`tokens_per_s`), and `ended_rows` says how many rows ended early anyway.

    PYTHONPATH=.:/tmp/site python3 bench/generation_gpu.py --out $OUT/generation_gpu.json   # H100, ~2-3 min
    python bench/generation_gpu.py --device cpu --tiny --out /tmp/generation_gpu.json      # smoke test, ~1 min

Each section records its own failure (traceback) and the script goes on; the JSON is rewritten after each one.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import torch  # noqa: E402

from bench.trainer_gpu import QWEN2_05B, TINY, Recorder, build_model, synthetic_tokenizer  # noqa: E402

WARMUP_TOKENS = 8  # new tokens of the untimed first call of each sampler (the compiled one compiles in it)


def make_prompts(count: int, low: int, high: int, vocab_size: int, seed: int) -> list[list[int]]:
    """Random token ids (past the tokenizer's 3 special ones) of random lengths in [low, high]."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(low, high + 1, (count,), generator=g).tolist()
    return [torch.randint(3, vocab_size, (n,), generator=g).tolist() for n in lengths]


def lora_model(arch: dict[str, Any], config: Any, device: torch.device) -> Any:
    """The bench model (same seed: the same weights every time) wrapped with the trainer's LoRA."""
    from peft import LoraConfig, get_peft_model

    from services.trainer.policy import resolve_dtype

    with torch.device(device):  # random init on the GPU: seconds instead of half a minute on the CPU
        model = build_model(arch, resolve_dtype(config.dtype, device), device, 0)
    lora = LoraConfig(
        r=config.lora_r,
        lora_alpha=config.lora_alpha,
        lora_dropout=config.lora_dropout,
        target_modules=list(config.lora_targets),
        task_type="CAUSAL_LM",
    )
    return get_peft_model(model, lora)


def timed(device: torch.device, sample: Any) -> tuple[float, list[list[int]]]:
    if device.type == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    completions = sample()
    if device.type == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - start, completions


def record_calls(data: dict[str, Any], device: torch.device, sample: Any, repeats: int, eos_ids: list[int]) -> None:
    """`repeats` timed calls of `sample() -> completions`; throughput of the last one and the mean."""
    calls = []
    for _ in range(repeats):
        seconds, completions = timed(device, sample)
        steps = max(len(c) for c in completions)
        calls.append(
            {
                "s": seconds,
                "rows": len(completions),
                "steps": steps,
                "tokens_per_s": len(completions) * steps / seconds,
                "ended_rows": sum(any(t in eos_ids for t in c) for c in completions),
            }
        )
        print(json.dumps(calls[-1]))
    data["calls"] = calls
    data["tokens_per_s"] = sum(c["tokens_per_s"] for c in calls) / len(calls)


def policy_section(
    backend: str, args: argparse.Namespace, arch: dict[str, Any], prompts: list[list[int]], data: dict[str, Any]
) -> None:
    from services.trainer.config import TrainConfig
    from services.trainer.policy import Policy

    device = torch.device(args.device)
    config = TrainConfig(
        model="random:qwen2-0.5b",
        max_new_tokens=args.new_tokens,
        max_prompt_tokens=max(2048, args.new_tokens + 256),
        generation_backend=backend,
    )
    policy = Policy(config, device, lora_model(arch, config, device), synthetic_tokenizer(arch["vocab_size"]))
    data["backend"] = policy.generation_backend
    data["eos_ids"] = policy.eos_ids
    # The warm-up call, WARMUP_TOKENS long (a stop request ends it): for `compiled` it builds the generation copy
    # and compiles the decode step, so its time is about the compile; for `hf` it warms up cuBLAS.
    calls = iter(range(WARMUP_TOKENS - 1))  # asked once per token after the first
    data["warmup_s"] = timed(device, lambda: policy.generate(prompts, should_stop=lambda: next(calls, None) is None))[0]
    repeats = args.compiled_repeats if policy.generation_backend == "compiled" else args.repeats
    record_calls(data, device, lambda: [ids for ids, _, _ in policy.generate(prompts)], repeats, policy.eos_ids)


def trl_section(args: argparse.Namespace, arch: dict[str, Any], prompts: list[list[int]], data: dict[str, Any]) -> None:
    """TRL 1.x GRPOTrainer._generate_single_turn without vLLM, on an accelerator-prepared copy of the model."""
    from accelerate import Accelerator
    from transformers import GenerationConfig
    from trl import GRPOConfig
    from trl.models import unwrap_model_for_generation

    from services.trainer.config import TrainConfig
    from services.trainer.policy import left_pad

    device = torch.device(args.device)
    config = TrainConfig(max_new_tokens=args.new_tokens)
    defaults = {f.name: f.default for f in dataclasses.fields(GRPOConfig)}
    accelerator = Accelerator(mixed_precision="bf16" if device.type == "cuda" else "no", cpu=device.type == "cpu")
    model = accelerator.prepare_model(lora_model(arch, config, device))
    tokenizer = synthetic_tokenizer(arch["vocab_size"])
    eos_ids = [tokenizer.eos_token_id]
    kwargs = {
        "max_new_tokens": args.new_tokens,
        "do_sample": True,
        "pad_token_id": tokenizer.pad_token_id,
        "bos_token_id": tokenizer.bos_token_id,
        "eos_token_id": eos_ids,
        "temperature": config.temperature,
        "top_p": config.top_p,
        "top_k": defaults["top_k"],
        "min_p": defaults["min_p"],
        "repetition_penalty": defaults["repetition_penalty"],
        "cache_implementation": defaults["cache_implementation"],
    }
    data["generation_kwargs"] = {k: v for k, v in kwargs.items() if k != "eos_token_id"}
    ids, mask = left_pad(prompts, tokenizer.pad_token_id)
    ids, mask = ids.to(device), mask.to(device)

    def sample(max_new_tokens: int = args.new_tokens) -> list[list[int]]:
        call_kwargs = {**kwargs, "max_new_tokens": max_new_tokens}
        generation_config = GenerationConfig(**call_kwargs, disable_compile=True)
        with (
            unwrap_model_for_generation(model, accelerator, generation_kwargs=call_kwargs) as unwrapped,
            torch.no_grad(),
        ):
            out = unwrapped.generate(input_ids=ids, attention_mask=mask, generation_config=generation_config)
        return out[:, ids.shape[1] :].tolist()

    data["warmup_s"] = timed(device, lambda: sample(WARMUP_TOKENS))[0]
    record_calls(data, device, sample, args.repeats, eos_ids)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "generation_gpu.json")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--tiny", action="store_true", help="tiny dims and batch: a smoke test on CPU")
    parser.add_argument("--repeats", type=int, default=1, help="timed calls of the hf and trl samplers")
    parser.add_argument("--compiled-repeats", type=int, default=3, help="timed calls of the compiled sampler")
    # compiled first: its number is the one wanted, and a run cut short keeps the sections it finished
    samplers = ["compiled", "hf", "trl"]
    parser.add_argument("--only", nargs="+", choices=samplers, default=samplers, help="samplers, in this order")
    args = parser.parse_args()
    arch = TINY if args.tiny else QWEN2_05B
    rows, low, high = (4, 40, 60) if args.tiny else (16, 640, 760)
    args.new_tokens = 16 if args.tiny else 256
    prompts = make_prompts(rows, low, high, arch["vocab_size"], seed=0)
    recorder = Recorder(args.out)
    import transformers

    recorder.results.update(
        {
            "args": {k: str(v) for k, v in vars(args).items()},
            "arch": arch,
            "rows": rows,
            "prompt_tokens": [min(map(len, prompts)), max(map(len, prompts))],
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
        }
    )
    for name in args.only:
        with recorder.section(name) as data:
            if name == "trl":
                import trl

                data["trl"] = trl.__version__
                trl_section(args, arch, prompts, data)
            else:
                policy_section(name, args, arch, prompts, data)
    sections = recorder.results["sections"]
    rates = {name: s.get("tokens_per_s") for name, s in sections.items() if s.get("tokens_per_s")}
    if "compiled" in rates:
        recorder.results["compiled_speedup"] = {
            f"vs_{name}": rates["compiled"] / rate for name, rate in rates.items() if name != "compiled"
        }
    recorder.save()
    print(json.dumps({"tokens_per_s": rates, "compiled_speedup": recorder.results.get("compiled_speedup")}))
    return 0 if all(s.get("ok") for s in sections.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
