"""GPU benchmark of one GRPO update with the design's batch (16 trajectories x 4 turns, 256 new tokens) on
Qwen2-0.5B's architecture with random weights (no weights or tokenizer reach the GPU machine), split into
generation, services (a real evaluator and builtin implementer started here) and optimisation; tokens/s and peak
memory; and TRL's GRPOTrainer on the same model, LoRA and batch for comparison.

    python bench/trainer_gpu.py --out bench/results/trainer_gpu.json            # on the GPU machine
    python bench/trainer_gpu.py --device cpu --tiny --out /tmp/trainer_gpu.json  # smoke test anywhere

Every section records its own failure (traceback) and the script goes on, so one run yields what it can; the JSON
is rewritten after every update. `--updates 1` halves the time; `--target torch` skips CUDA compiles in the
services; `--skip-trl` leaves TRL out.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import platform
import sys
import tempfile
import time
import traceback
from collections.abc import Iterator
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import torch  # noqa: E402

# Qwen/Qwen2-0.5B-Instruct's config.json values.
QWEN2_05B = {
    "hidden_size": 896,
    "num_hidden_layers": 24,
    "num_attention_heads": 14,
    "num_key_value_heads": 2,
    "intermediate_size": 4864,
    "vocab_size": 151936,
    "tie_word_embeddings": True,
    "rope_theta": 1_000_000.0,
    "max_position_embeddings": 32768,
    "rms_norm_eps": 1e-6,
}
TINY = {
    **QWEN2_05B,
    "hidden_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "intermediate_size": 128,
    "vocab_size": 4096,
}
# Suggestions the builtin implementer acts on, so the services see real work rather than unrecognised text.
SUGGESTIONS = [
    "Fuse the element-wise chain into one generated kernel.",
    "Remove the redundant computation and reuse the first result.",
    "Use vectorized float4 loads and stores in the element-wise kernel.",
    "Fuse the bias add and the activation into the matmul epilogue.",
]


def synthetic_tokenizer(vocab_size: int) -> Any:
    """A real fast tokenizer over `vocab_size` synthetic tokens, ~4 characters a token (BPE-like lengths)."""
    from tokenizers import Regex, Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<unk>": 0, "<eos>": 1, "<pad>": 2, **{f"t{i}": i for i in range(3, vocab_size)}}
    core = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.Split(Regex(r"\S{1,4}|\s+"), behavior="isolated")
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=core, unk_token="<unk>", eos_token="<eos>", pad_token="<pad>")
    tokenizer.chat_template = (
        "{% for m in messages %}<{{ m.role }}> {{ m.content }} <eos> {% endfor %}"
        "{% if add_generation_prompt %}<assistant> {% endif %}"
    )
    return tokenizer


class Recorder:
    def __init__(self, out: Path) -> None:
        self.out, self.results = out, {"sections": {}}

    @contextlib.contextmanager
    def section(self, name: str) -> Iterator[dict[str, Any]]:
        data: dict[str, Any] = {}
        self.results["sections"][name] = data
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
        start = time.perf_counter()
        try:
            yield data
            data["ok"] = True
        except Exception:  # noqa: BLE001 - a failed section is recorded; the run goes on
            data["ok"], data["error"] = False, traceback.format_exc()[-4000:]
            print(f"[{name}] failed:\n{data['error']}", file=sys.stderr)
        data["wall_s"] = time.perf_counter() - start
        if torch.cuda.is_available():
            data["peak_memory_gib"] = torch.cuda.max_memory_allocated() / 2**30
        self.save()

    def save(self) -> None:
        self.out.parent.mkdir(parents=True, exist_ok=True)
        self.out.write_text(json.dumps(self.results, indent=2))


def build_model(arch: dict[str, Any], dtype: torch.dtype, device: torch.device, seed: int) -> Any:
    from transformers import AutoModelForCausalLM, Qwen2Config

    torch.manual_seed(seed)
    config = Qwen2Config(**arch, bos_token_id=1, eos_token_id=1, pad_token_id=2)
    return AutoModelForCausalLM.from_config(config, dtype=dtype).to(device)


def our_updates(args: argparse.Namespace, arch: dict[str, Any], data: dict[str, Any], save: Any) -> None:
    from peft import LoraConfig, get_peft_model

    from problems import load_problems
    from services.trainer.config import TrainConfig
    from services.trainer.episodes import run_episodes
    from services.trainer.grpo import assign_returns_and_advantages, evaluation_seed, make_services, optimise
    from services.trainer.policy import Policy, resolve_dtype
    from tests.servers import run_service

    device = torch.device(args.device)
    config = TrainConfig(
        model="random:qwen2-0.5b",
        problems_per_step=args.trajectories // 4,
        num_trajectories=4,
        max_steps_per_episode=args.turns,
        max_new_tokens=args.new_tokens,
        max_prompt_tokens=args.prompt_tokens,
        timing_trials=args.timing_trials,
        gradient_checkpointing=args.gradient_checkpointing,
        target=args.target,
    )
    tokenizer = synthetic_tokenizer(arch["vocab_size"])
    dtype = resolve_dtype(config.dtype, device)
    model = get_peft_model(
        build_model(arch, dtype, device, config.seed),
        LoraConfig(
            r=config.lora_r, lora_alpha=config.lora_alpha, target_modules=config.lora_targets, task_type="CAUSAL_LM"
        ),
    )
    if config.gradient_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    policy = Policy(config, device, model, tokenizer)
    trainable = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trainable, lr=config.learning_rate)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
    problems = load_problems(args.problems or ("builtin:gpu" if device.type == "cuda" else "builtin:cpu"))
    data["updates"] = []
    # a fresh build cache unless one is named: each run pays its own builds, as the first update of a training run does
    evaluator_env = {
        "EVALUATOR_CACHE_DIR": tempfile.mkdtemp(prefix="evaluator_cache_"),
        **dict(item.split("=", 1) for item in args.evaluator_env),
    }
    log_dir = args.out.parent
    with (
        run_service("evaluator", env=evaluator_env, log_path=log_dir / "evaluator.log") as evaluator,
        run_service(
            "implementer", env={"IMPLEMENTER_BACKEND": "builtin"}, log_path=log_dir / "implementer.log"
        ) as implementer,
    ):
        config.evaluator_urls, config.implementer_urls = [evaluator], [implementer]
        services = make_services(config)
        loop = asyncio.new_event_loop()
        generation = {"s": 0.0, "tokens": 0, "calls": 0}

        def generate(prompts: list[list[int]]) -> list[tuple[list[int], str, bool]]:
            start = time.perf_counter()
            out = policy.generate(prompts)
            if device.type == "cuda":
                torch.cuda.synchronize()
            generation["s"] += time.perf_counter() - start
            generation["tokens"] += sum(len(ids) for ids, _, _ in out)
            generation["calls"] += 1
            print(f"generation call {generation['calls']}: {len(prompts)} prompts, {time.perf_counter() - start:.1f} s")
            # random weights write no usable text: send suggestions the builtin implementer acts on
            return [
                (ids, SUGGESTIONS[(i + generation["calls"]) % len(SUGGESTIONS)], done)
                for i, (ids, _, done) in enumerate(out)
            ]

        for update in range(args.updates):
            generation.update(s=0.0, tokens=0)
            chosen = [
                problems[(update * config.problems_per_step + i) % len(problems)]
                for i in range(config.problems_per_step)
            ]
            start = time.perf_counter()
            turns = loop.run_until_complete(
                run_episodes(
                    chosen,
                    config.num_trajectories,
                    config.max_steps_per_episode,
                    tokenizer,
                    generate,
                    services,
                    config.max_prompt_tokens,
                    input_seed=evaluation_seed(config.seed, update + 1),
                )
            )
            rollout_s = time.perf_counter() - start
            samples = assign_returns_and_advantages(turns, config)
            start = time.perf_counter()
            stats = optimise(policy, samples, config, optimizer, scheduler, None, torch.Generator().manual_seed(0))
            if device.type == "cuda":
                torch.cuda.synchronize()
            optimisation_s = time.perf_counter() - start
            data["updates"].append(
                {
                    "samples": len(samples),
                    "turns": len(turns),
                    "mean_prompt_tokens": sum(len(t.prompt_ids) for t in turns) / len(turns),
                    "generated_tokens": generation["tokens"],
                    "generation_s": generation["s"],
                    "generation_tokens_per_s": generation["tokens"] / max(generation["s"], 1e-9),
                    "services_s": rollout_s - generation["s"],
                    "optimisation_s": optimisation_s,
                    "update_s": rollout_s + optimisation_s,
                    "verdicts": sorted({str(t.verdict) for t in turns}),
                    "loss": stats.get("losses/loss"),
                }
            )
            print(json.dumps(data["updates"][-1]))
            save()  # a run cut short by the machine's time limit still leaves the updates it finished
        loop.run_until_complete(services.aclose())
        loop.close()


def trl_updates(
    args: argparse.Namespace, arch: dict[str, Any], data: dict[str, Any], tmp: Path, prompt_tokens: int
) -> None:
    """TRL's GRPOTrainer, same model, LoRA and batch: 64 completions per generation (16 prompts x 4), mini-batch 4,
    accumulation 2, 2 iterations; one "update" = one generation batch = 16 optimizer steps."""
    from datasets import Dataset
    from peft import LoraConfig
    from trl import GRPOConfig, GRPOTrainer

    from services.trainer.config import TrainConfig

    defaults = TrainConfig()
    device = torch.device(args.device)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    tokenizer = synthetic_tokenizer(arch["vocab_size"])
    model = build_model(arch, dtype, device, 0)
    model.save_pretrained(tmp / "model")  # TRL's own loaders expect a path
    samples = args.trajectories * args.turns
    # one synthetic word and one space per two tokens: prompts as long as our episodes' mean prompt
    words = " ".join(f"t{i % (arch['vocab_size'] - 3) + 3}" for i in range(prompt_tokens // 2))
    dataset = Dataset.from_dict({"prompt": [words] * (samples * (args.updates + 1))})
    steps_per_update = samples // (defaults.mini_batch_size * defaults.gradient_accumulation_steps) * 2
    config = GRPOConfig(
        output_dir=str(tmp / "trl"),
        per_device_train_batch_size=defaults.mini_batch_size,
        num_generations=4,
        gradient_accumulation_steps=defaults.gradient_accumulation_steps,
        generation_batch_size=samples,
        num_iterations=defaults.ppo_epochs,
        max_completion_length=args.new_tokens,
        temperature=defaults.temperature,
        top_p=defaults.top_p,
        beta=defaults.beta,
        epsilon=defaults.epsilon,
        learning_rate=defaults.learning_rate,
        loss_type="dapo",
        bf16=device.type == "cuda",
        use_cpu=device.type == "cpu",
        report_to="none",
        max_steps=steps_per_update * args.updates,
        logging_steps=steps_per_update,
        save_strategy="no",
        gradient_checkpointing=args.gradient_checkpointing,
    )
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=lambda completions, **kw: [float(len(c) % 3) for c in completions],
        args=config,
        train_dataset=dataset,
        processing_class=tokenizer,
        peft_config=LoraConfig(
            r=defaults.lora_r,
            lora_alpha=defaults.lora_alpha,
            target_modules=defaults.lora_targets,
            task_type="CAUSAL_LM",
        ),
    )
    start = time.perf_counter()
    trainer.train()
    total = time.perf_counter() - start
    data.update(
        {
            "updates": args.updates,
            "samples_per_update": samples,
            "optimizer_steps": config.max_steps,
            "train_s": total,
            "update_s": total / args.updates,
            "log": [row for row in trainer.state.log_history if "loss" in row][-3:],
        }
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "trainer_gpu.json")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--tiny", action="store_true", help="tiny dims and batch: a smoke test on CPU")
    parser.add_argument("--updates", type=int, default=2, help="timed updates of each trainer")
    parser.add_argument("--gradient-checkpointing", action="store_true")
    parser.add_argument("--skip-trl", action="store_true")
    parser.add_argument("--target", default="cuda", choices=["cuda", "triton", "torch"])
    parser.add_argument("--problems", help="problem set (default: builtin:gpu on CUDA, builtin:cpu otherwise)")
    parser.add_argument(
        "--evaluator-env",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="evaluator setting, e.g. EVALUATOR_WORKERS=8",
    )
    args = parser.parse_args()
    arch = TINY if args.tiny else QWEN2_05B
    args.trajectories, args.turns = (4, 2) if args.tiny else (16, 4)
    args.new_tokens, args.prompt_tokens = (16, 1024) if args.tiny else (256, 3072)
    args.timing_trials = 5 if args.tiny else 100
    if args.tiny:
        args.updates, args.target = 1, "torch" if args.device == "cpu" else args.target
    recorder = Recorder(args.out)
    import transformers

    recorder.results.update(
        {
            "args": {k: str(v) for k, v in vars(args).items()},
            "arch": arch,
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "python": platform.python_version(),
            "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
        }
    )
    with contextlib.suppress(ImportError):
        import trl

        recorder.results["trl"] = trl.__version__
    with recorder.section("ours") as data:
        our_updates(args, arch, data, recorder.save)
    if not args.skip_trl:
        import tempfile

        with tempfile.TemporaryDirectory() as tmp, recorder.section("trl_grpo_trainer") as data:
            ours = recorder.results["sections"]["ours"].get("updates") or [{}]
            prompt_tokens = int(ours[-1].get("mean_prompt_tokens", 1000))
            data["prompt_tokens"] = prompt_tokens
            trl_updates(args, arch, data, Path(tmp), prompt_tokens)
    recorder.save()
    print(json.dumps(recorder.results, indent=2)[:4000])
    return 0 if all(s.get("ok") for s in recorder.results["sections"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
