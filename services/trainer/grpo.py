"""Multi-turn GRPO, top to bottom: rollout -> rewards -> returns -> advantages -> clipped loss + KL -> step -> log ->
checkpoint. Helpers (the math) first, then `train`, the one loop."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import random
import statistics
import time
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from services.trainer.checkpoint import latest_checkpoint, load_checkpoint, save_checkpoint
from services.trainer.config import ConfigError, TrainConfig
from services.trainer.episodes import (
    Interrupted,
    Turn,
    check_services,
    make_services,
    published_vocabulary,
    run_episodes,
)
from services.trainer.logging_utils import RunLogger, make_progress, plot_reward_curve
from services.trainer.policy import Policy, load_policy, make_batch
from services.trainer.processes import StopFlag, equalise_steps, gather_turns, truncate_logs
from services.trainer.prompts import fixed_prompt_tokens, technique_menu
from shared.contracts import TrainerStatus

log = logging.getLogger(__name__)
PROGRESS_EVERY_S = 30.0  # optimisation progress lines at most this often
STD_EPS = 1e-4  # as TRL: (R - mean) / (std + 1e-4)


class NothingLearned(RuntimeError):
    """Updates ran but none had a sample to learn from (every turn left out: the services failed every request)."""


# ---------------------------------------------------------------- returns and advantages
def discounted_returns(rewards: Sequence[float | None], gamma: float) -> list[float | None]:
    """R_t = r_t + gamma * R_next over one trajectory's turns, R_next the return of the next turn that has a reward.

    A left-out turn (reward None: the implementer or the evaluator failed) is skipped, not scored 0: the state did
    not move on it, so the next turn acted from the same kernel, and a 0 would pull every earlier return towards 0
    for a failure of the services. Its own return is None."""
    returns: list[float | None] = [None] * len(rewards)
    running = 0.0
    for t in reversed(range(len(rewards))):
        r = rewards[t]
        if r is None:
            continue
        running = r + gamma * running
        returns[t] = running
    return returns


def group_advantages(
    returns: Sequence[float], groups: Sequence[Any], scale_rewards: bool, std_floor: float = 0.0
) -> list[float]:
    """(R - mean) / (max(std, std_floor) + eps) within each group (unbiased std, as TRL); a group of one gets 0.

    The floor keeps a group whose returns differ only by timing noise (a few percent of speedup) from getting
    full-size +-1 advantages out of that noise."""
    members: dict[Any, list[int]] = defaultdict(list)
    for i, key in enumerate(groups):
        members[key].append(i)
    advantages = [0.0] * len(returns)
    for idx in members.values():
        values = [returns[i] for i in idx]
        mean = statistics.fmean(values)
        std = max(statistics.stdev(values) if len(values) > 1 else 0.0, std_floor)
        for i in idx:
            advantages[i] = (returns[i] - mean) / (std + STD_EPS) if scale_rewards else returns[i] - mean
    return advantages


def advantage_group(turn: Turn, config: TrainConfig) -> tuple[int, ...]:
    """The samples a turn's advantage is normalised over: its problem's, or its problem's at its turn index."""
    return (turn.group, turn.turn) if config.advantage_scope == "group_per_turn" else (turn.group,)


def assign_returns_and_advantages(turns: list[Turn], config: TrainConfig) -> list[Turn]:
    """Set ret/advantage on every turn; returns the turns that go into the loss (reward not None)."""
    by_trajectory: dict[tuple[int, int], list[Turn]] = defaultdict(list)
    for turn in turns:
        by_trajectory[(turn.group, turn.trajectory)].append(turn)
    for trajectory in by_trajectory.values():
        trajectory.sort(key=lambda t: t.turn)
        for turn, ret in zip(trajectory, discounted_returns([t.reward for t in trajectory], config.gamma), strict=True):
            turn.ret = 0.0 if ret is None else ret  # left out: not a sample, its return is never used
    samples = [t for t in turns if t.reward is not None]
    groups = [advantage_group(t, config) for t in samples]
    advantages = group_advantages([t.ret for t in samples], groups, config.scale_rewards, config.std_floor)
    for turn, adv in zip(samples, advantages, strict=True):
        turn.advantage = adv
    return samples


# ---------------------------------------------------------------- the loss
def grpo_loss(
    logps: torch.Tensor,
    old_logps: torch.Tensor,
    ref_logps: torch.Tensor | None,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    epsilon: float,
    epsilon_high: float,
    beta: float,
    normalization: str,
    normalizer: float,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Clipped importance-ratio loss plus beta * k3 KL, summed over this mini-batch and divided by `normalizer`:
    the token count (token) or completion count (sequence) of the whole optimizer step, so accumulated
    mini-batches add up to one mean."""
    valid = mask.bool()
    mask = mask.to(logps.dtype)
    # Padding positions get log-ratio 0, so a huge pad value can never turn into inf * 0 = nan in the backward.
    ratio = torch.exp(torch.where(valid, logps - old_logps, 0.0))
    adv = advantages[:, None]
    pg_loss = torch.max(-adv * ratio, -adv * torch.clamp(ratio, 1 - epsilon, 1 + epsilon_high))
    per_token = pg_loss
    kl = torch.zeros_like(logps)
    if beta > 0 and ref_logps is not None:
        delta = torch.where(valid, ref_logps - logps, 0.0)
        kl = torch.exp(delta) - delta - 1  # k3: unbiased, always >= 0
        per_token = per_token + beta * kl
    if normalization == "token":
        loss = (per_token * mask).sum() / normalizer
    else:
        loss = ((per_token * mask).sum(-1) / mask.sum(-1).clamp(min=1)).sum() / normalizer
    clipped = ((ratio < 1 - epsilon) & (adv < 0)) | ((ratio > 1 + epsilon_high) & (adv > 0))
    tokens = mask.sum().clamp(min=1)
    stats = {
        "kl": (kl * mask).sum() / tokens,
        "clip_ratio": (clipped.to(mask.dtype) * mask).sum() / tokens,
        "ratio": (ratio * mask).sum() / tokens,
    }
    return loss, stats


def mini_batches(n_samples: int, config: TrainConfig, generator: torch.Generator) -> list[list[int]]:
    """Shuffled sample indices in mini-batches of `mini_batch_size`, drawn once per update."""
    order = torch.randperm(n_samples, generator=generator).tolist()
    return [order[i : i + config.mini_batch_size] for i in range(0, n_samples, config.mini_batch_size)]


def optimizer_steps(minis: list[list[int]], config: TrainConfig, generator: torch.Generator) -> list[list[list[int]]]:
    """One epoch: the update's mini-batches in a new order, `gradient_accumulation_steps` per optimizer step."""
    order = torch.randperm(len(minis), generator=generator).tolist()
    k = config.gradient_accumulation_steps
    return [[minis[j] for j in order[i : i + k]] for i in range(0, len(order), k)]


def pad_rows(rows: list[torch.Tensor], width: int) -> torch.Tensor:
    out = torch.zeros(len(rows), width, dtype=rows[0].dtype, device=rows[0].device)
    for i, row in enumerate(rows):
        out[i, : len(row)] = row
    return out


def optimise(
    policy: Policy,
    samples: list[Turn],
    config: TrainConfig,
    optimizer: torch.optim.Optimizer,
    scheduler: Any,
    accelerator: Any,
    generator: torch.Generator,
) -> dict[str, float]:
    """One update's optimisation: old and reference log-probs of exactly the sampled ids, once, before the first
    epoch (no_grad, same forward path as training); then ppo_epochs x optimizer steps x accumulated mini-batches.

    The mini-batches are drawn once and the old log-probs are taken of those very batches; each epoch visits them in
    a new order. Another split pads each sample differently, and in bf16 the rounding follows the padding (mean
    |dlogp| 0.014, max 0.21 on SmolLM2), so the first ratio would not be 1."""
    device = policy.device
    pad = policy.tokenizer.pad_token_id
    minis = mini_batches(len(samples), config, generator)
    old_logps: dict[int, torch.Tensor] = {}
    ref_logps: dict[int, torch.Tensor] = {}
    with torch.no_grad():
        for mini in minis:
            chunk = [samples[i] for i in mini]
            batch = make_batch([t.prompt_ids for t in chunk], [t.completion_ids for t in chunk], pad, device)
            for i, row in zip(mini, policy.logprobs(batch)[0], strict=True):
                old_logps[i] = row[: len(samples[i].completion_ids)]
            if config.beta > 0:
                for i, row in zip(mini, policy.reference_logprobs(batch), strict=True):
                    ref_logps[i] = row[: len(samples[i].completion_ids)]

    stats: dict[str, list[float]] = defaultdict(list)
    eps_high = config.epsilon_high if config.epsilon_high is not None else config.epsilon
    trainable = [p for p in policy.model.parameters() if p.requires_grad]
    last_report = time.monotonic()
    for epoch in range(config.ppo_epochs):
        steps = equalise_steps(optimizer_steps(minis, config, generator), accelerator)
        for number, step in enumerate(steps, start=1):
            per_sample = (lambda t: len(t.completion_ids)) if config.loss_normalization == "token" else (lambda t: 1)
            normalizer = float(sum(per_sample(samples[i]) for mini in step for i in mini)) or 1.0
            for mini in step:
                if not mini:  # padding (equalise_steps): DDP all-reduces in every backward, so every process runs one
                    filler = make_batch([[pad]], [[pad]], pad, device)
                    accelerator.backward(policy.logprobs(filler)[0].sum() * 0.0)
                    continue
                chunk = [samples[i] for i in mini]
                batch = make_batch([t.prompt_ids for t in chunk], [t.completion_ids for t in chunk], pad, device)
                width = batch.completion_ids.shape[1]
                logps, entropy = policy.logprobs(batch, with_entropy=True)
                assert entropy is not None  # requested with with_entropy=True
                loss, s = grpo_loss(
                    logps,
                    pad_rows([old_logps[i] for i in mini], width),
                    pad_rows([ref_logps[i] for i in mini], width) if ref_logps else None,
                    torch.tensor([t.advantage for t in chunk], device=device),
                    batch.completion_mask,
                    config.epsilon,
                    eps_high,
                    config.beta,
                    config.loss_normalization,
                    normalizer,
                )
                if accelerator is not None:
                    accelerator.backward(loss)
                else:
                    loss.backward()
                mask = batch.completion_mask.float()
                stats["losses/loss"].append(loss.item())
                stats["losses/entropy"].append(((entropy * mask).sum() / mask.sum().clamp(min=1)).item())
                for key, value in s.items():
                    stats[f"losses/{key}"].append(value.item())
            grad_norm = torch.nn.utils.clip_grad_norm_(trainable, config.max_grad_norm)
            stats["losses/grad_norm"].append(float(grad_norm))
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad(set_to_none=True)
            if time.monotonic() - last_report >= PROGRESS_EVERY_S:  # a CPU update optimises for minutes
                last_report = time.monotonic()
                log.info(
                    "optimising: epoch %d/%d, step %d/%d, loss %.4f",
                    epoch + 1,
                    config.ppo_epochs,
                    number,
                    len(steps),
                    stats["losses/loss"][-1] if stats["losses/loss"] else float("nan"),
                )
    return {k: statistics.fmean(v) for k, v in stats.items()}


def select_problems(problems: Sequence[Any], update: int, count: int, seed: int) -> list[Any]:
    """Problems of one update: consecutive slices of seeded permutations, a function of (seed, update) only, so a
    resumed run sees the same problems it would have seen."""
    chosen = []
    for position in range(update * count, (update + 1) * count):
        epoch, offset = divmod(position, len(problems))
        order = list(range(len(problems)))
        random.Random(seed * 100_003 + epoch).shuffle(order)
        chosen.append(problems[order[offset]])
    return chosen


def evaluation_seed(seed: int, update: int) -> int:
    """Seed of the evaluator's inputs in one update: new inputs every update, one set for all samples of a group
    (so advantages compare kernels, not input draws); a function of (seed, update) only, as select_problems."""
    return random.Random(f"inputs-{seed}-{update}").randrange(2**31)


def rollout_metrics(turns: list[Turn], samples: list[Turn], config: TrainConfig) -> dict[str, float]:
    rewards = [t.reward for t in samples if t.reward is not None]
    scored = [t for t in turns if t.verdict not in (None, "evaluator_error")]
    speedups = [t.speedup for t in turns if t.speedup is not None]
    group_returns = defaultdict(list)
    for t in samples:
        group_returns[advantage_group(t, config)].append(t.ret)
    latencies = [t.eval_latency_s for t in turns if t.eval_latency_s is not None]  # reused verdicts have none
    return {
        "reward/mean": statistics.fmean(rewards) if rewards else 0.0,
        "reward/std": statistics.pstdev(rewards) if rewards else 0.0,
        "reward/frac_zero_std_groups": statistics.fmean([float(len(set(v)) <= 1) for v in group_returns.values()])
        if group_returns
        else 0.0,
        "rate/compiled": statistics.fmean([t.verdict not in ("compile_error", "rejected") for t in scored])
        if scored
        else 0.0,
        "rate/correct": sum(t.verdict == "correct" for t in turns) / max(len(turns), 1),
        # with the builtin implementer most suggestions name nothing it can apply and C equals B
        "rate/kernel_changed": sum(bool(t.kernel_changed) for t in turns) / max(len(turns), 1),
        "rate/left_out": 1 - len(samples) / max(len(turns), 1),
        "rate/upstream_error": sum(t.implement_status == "upstream_error" for t in turns) / max(len(turns), 1),
        "rate/evaluator_error": sum(t.verdict == "evaluator_error" for t in turns) / max(len(turns), 1),
        "speedup/mean": statistics.fmean(speedups) if speedups else 0.0,
        "speedup/best": max(speedups, default=0.0),
        "completions/mean_length": statistics.fmean([len(t.completion_ids) for t in turns]),
        "completions/clipped_ratio": statistics.fmean([not t.finished for t in turns]),
        "services/eval_latency_s": statistics.fmean(latencies) if latencies else 0.0,
        "services/evaluations": float(len(latencies)),
    }


def has_signal(update: int, metrics: dict[str, float], warn: bool) -> bool:
    """Whether some group's samples got different returns; if none did, every advantage is 0 and the update only
    moved the KL term, which a mean reward alone never shows, so say so in the console."""
    if metrics["samples"] > 0 and metrics["reward/frac_zero_std_groups"] < 1.0:
        return True
    if warn:
        log.warning(
            "update %d had nothing to learn from: within every group all samples got the same return, so every "
            "advantage is 0 (%.0f%% of the suggestions changed the kernel)",
            update,
            100 * metrics["rate/kernel_changed"],
        )
    return False


def check_prompt_budget(tokenizer: Any, config: TrainConfig, menu: str) -> None:
    """The parts of a prompt that are never cut must leave room for the kernels; else the first turn would fail,
    after minutes of loading and generating."""
    fixed = fixed_prompt_tokens(tokenizer, config.target, menu, config.max_new_tokens)
    if fixed + 64 > config.max_prompt_tokens:
        raise ConfigError(
            f"max_prompt_tokens {config.max_prompt_tokens} leaves no room for the kernels: the instruction"
            f"{', the technique menu' if menu else ''}, a verdict and a previous suggestion take up to {fixed} "
            f"tokens; fix: raise max_prompt_tokens to at least {fixed + 512}"
        )


# ---------------------------------------------------------------- the loop
def train(config: TrainConfig, resume: bool = False) -> Path:  # one loop, read top to bottom (CleanRL style)
    from accelerate import Accelerator

    # 0. the services first: a dead URL fails here in seconds, not after a rollout of evaluator_errors
    answers = check_services(
        config.evaluator_urls,
        config.implementer_urls,
        os.environ.get(config.api_token_env) or None,
        config.request_retries,
    )
    menu = technique_menu(published_vocabulary(answers, config.implementer_urls)) if config.prompt_techniques else ""
    run_dir = Path(config.output_dir)
    run_dir.mkdir(parents=True, exist_ok=True)

    # 1. seed everything, then build the policy, optimizer and scheduler
    random.seed(config.seed)
    np.random.seed(config.seed)
    torch.manual_seed(config.seed)
    # without a GPU, processes started by torchrun / accelerate launch train together over gloo
    accelerator = Accelerator(cpu=not torch.cuda.is_available())
    main_process = accelerator.is_main_process
    if main_process:
        log.info(
            "config: model %s, problems %s, %d updates of %d x %d trajectories; all fields in %s/config.json",
            config.model,
            config.problems,
            config.updates,
            config.problems_per_step,
            config.num_trajectories,
            run_dir,
        )
        log.debug("config:\n%s", "\n".join(f"  {k}: {v}" for k, v in config.to_dict().items()))
    checkpoint = latest_checkpoint(run_dir) if resume else None
    if resume and checkpoint is None:
        log.warning("--resume: no checkpoint in %s; starting at update 0", run_dir)
    policy = load_policy(config, accelerator.device, resume_weights=checkpoint / "model" if checkpoint else None)
    check_prompt_budget(policy.tokenizer, config, menu)
    trainable = [p for p in policy.model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trainable, lr=config.learning_rate, weight_decay=config.weight_decay)
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: min(1.0, (step + 1) / config.warmup_steps) if config.warmup_steps else 1.0
    )
    policy.forward_model, optimizer = accelerator.prepare(policy.model, optimizer)
    start = 0
    if checkpoint is not None:
        start = load_checkpoint(checkpoint, optimizer, scheduler)
        truncate_logs(run_dir, start, accelerator)
        log.info("resumed from %s at update %d", checkpoint, start)
    if main_process:
        (run_dir / "config.json").write_text(json.dumps(config.to_dict(), indent=2))

    # 2. problems (split over processes), services, outputs
    from problems import KernelBenchUnavailable, load_problems

    try:
        problems = load_problems(config.problems)
    except (ValueError, KernelBenchUnavailable) as exc:
        raise ConfigError(f"problems {config.problems!r}: {exc}") from exc
    per_process = max(1, config.problems_per_step // accelerator.num_processes)
    services = make_services(config, menu)
    logger = RunLogger(run_dir, enabled=main_process)
    stop = StopFlag()
    loop = asyncio.new_event_loop()
    shuffle = torch.Generator().manual_seed(config.seed)
    state: dict[str, Any] = {"state": "training", "update": start, "metrics": {}}
    status_server = None
    if config.status_port and main_process:
        from services.trainer.status import StatusServer

        status_server = StatusServer(
            lambda: TrainerStatus(
                state=state["state"],
                update=state["update"],
                total_updates=config.updates,
                run_dir=str(run_dir),
                last_metrics=state["metrics"],
            ),
            config.status_port,
        )
        status_server.start()
    saved_update, empty_updates, updates_run, updates_with_samples = start, 0, 0, 0
    generation_s = [0.0]  # seconds spent generating in the current update

    def generate(prompts: list[list[int]]) -> list[tuple[list[int], str, bool]]:
        t0 = time.perf_counter()
        out = policy.generate(prompts, should_stop=stop)
        generation_s[0] += time.perf_counter() - t0
        return out

    progress = make_progress(main_process)
    bar = progress.add_task("updates", total=config.updates, completed=start, info="")
    episodes_bar = progress.add_task(
        "episodes",
        total=config.updates * config.batch_trajectories,
        completed=start * config.batch_trajectories,
        info="",
    )
    try:
        with progress:
            for update in range(start + 1, config.updates + 1):
                t_update = time.perf_counter()
                # 3. rollout: G trajectories per problem, every turn of every episode; rewards come from the verdicts
                selection = select_problems(problems, update - 1, config.problems_per_step, config.seed)
                mine = selection[accelerator.process_index :: accelerator.num_processes][:per_process]
                generation_s[0] = 0.0
                try:
                    turns = loop.run_until_complete(
                        run_episodes(
                            mine,
                            config.num_trajectories,
                            config.max_steps_per_episode,
                            policy.tokenizer,
                            generate,
                            services,
                            config.max_prompt_tokens,
                            lambda: stop.agreed(accelerator),  # every process abandons the update, or none does
                            input_seed=evaluation_seed(config.seed, update),
                        )
                    )
                except Interrupted:
                    log.warning("update %d abandoned before any optimizer step", update)
                    break
                t_rollout = time.perf_counter() - t_update

                # 4. returns R_t = r_t + gamma R_{t+1}, then advantages normalised within each problem's group
                samples = assign_returns_and_advantages(turns, config)
                all_turns, all_samples = gather_turns(turns, accelerator, per_process)
                metrics = rollout_metrics(all_turns, all_samples, config)
                n_tokens = sum(len(t.completion_ids) for t in all_turns)
                empty_updates = 0 if all_samples else empty_updates + 1
                updates_run, updates_with_samples = updates_run + 1, updates_with_samples + bool(all_samples)
                if empty_updates >= config.max_empty_updates:
                    raise NothingLearned(
                        f"{empty_updates} updates in a row without a usable sample ({_left_out(metrics)})"
                    )

                # 5-6. old/reference log-probs once, then ppo_epochs of the clipped loss + KL (optimise, above)
                t_opt = time.perf_counter()
                stats = optimise(policy, samples, config, optimizer, scheduler, accelerator, shuffle)
                t_opt = time.perf_counter() - t_opt

                # 7. log: metrics.jsonl, episodes.jsonl, TensorBoard, progress, /status
                metrics.update(stats)
                metrics.update(
                    {
                        "perf/tokens_per_s": n_tokens / max(generation_s[0], 1e-9),
                        "time/generation_s": generation_s[0],
                        "time/services_s": t_rollout - generation_s[0],
                        "time/optimisation_s": t_opt,
                        "time/update_s": time.perf_counter() - t_update,
                        "lr": float(scheduler.get_last_lr()[0]),  # the stub allows a Tensor lr; ours is a float
                        "samples": float(len(all_samples)),
                    }
                )
                logger.log_update(update, metrics, all_turns)
                signal_note = "" if has_signal(update, metrics, main_process) else " (nothing to learn from)"
                state.update(update=update, metrics={"update": update, **metrics})
                progress.update(bar, advance=1, info=f"reward {metrics['reward/mean']:+.3f}{signal_note}")
                progress.update(episodes_bar, advance=config.batch_trajectories, info="")

                # 8. checkpoint every save_every updates (and when asked to stop: decided together, see agreed)
                stopping = stop.agreed(accelerator)
                if main_process and (update % config.save_every == 0 or stopping):
                    save_checkpoint(
                        run_dir,
                        update,
                        policy.model,
                        policy.tokenizer,
                        optimizer,
                        scheduler,
                        config.to_dict(),
                        config.keep_checkpoints,
                    )
                    saved_update = update
                accelerator.wait_for_everyone()
                if stopping:
                    break
        finished = state["update"] == config.updates
        # a run whose every turn was left out trained nothing: no final/, and the caller sees a failure
        learned_nothing = updates_run > 0 and updates_with_samples == 0
        if main_process and state["update"] != saved_update:
            save_checkpoint(
                run_dir,
                state["update"],
                policy.model,
                policy.tokenizer,
                optimizer,
                scheduler,
                config.to_dict(),
                config.keep_checkpoints,
            )
        if main_process and finished and not learned_nothing:
            policy.model.save_pretrained(run_dir / "final")
            policy.tokenizer.save_pretrained(run_dir / "final")
        if main_process and logger.metrics_path.exists():
            plot_reward_curve(logger.metrics_path, run_dir / "reward_curve.png")
        state["state"] = "finished" if finished else "training"
        accelerator.wait_for_everyone()  # the main process may still be writing final/
        accelerator.end_training()  # leaves the process group (several processes) before exiting
        if learned_nothing:
            raise NothingLearned(
                f"none of the {updates_run} updates had a usable sample ({_left_out(state['metrics'])}); "
                f"{run_dir / 'final'} was not written"
            )
    except BaseException:
        state["state"] = "failed"
        raise
    finally:
        loop.run_until_complete(services.aclose())
        loop.close()
        logger.close()
        if status_server is not None:
            status_server.stop()
    return run_dir


def _left_out(metrics: dict[str, float]) -> str:
    """Why the samples were left out, for NothingLearned, with the fix."""
    return (
        f"evaluator_error {metrics.get('rate/evaluator_error', 0.0):.0%} and implementer upstream_error "
        f"{metrics.get('rate/upstream_error', 0.0):.0%} of the last update's turns; fix: check the evaluator and "
        "implementer logs (a GPU evaluator without a GPU, an LLM server that is down or rate-limited)"
    )
