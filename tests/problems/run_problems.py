"""Run KernelBench problem sources given as a JSON list on stdin; print one JSON line per problem.

Used by the tests as a subprocess, so that problem code never runs in the test process.
Each line: {"id", "ok", "error", "median_ms", "peak_mib", "out_shape", "out_finite", "deterministic"}.
"""

import json
import statistics
import sys
import time

import torch


def _build(source: str, device: str) -> tuple[torch.nn.Module, list]:
    namespace: dict = {"__name__": "problem"}
    exec(compile(source, "<problem>", "exec"), namespace)
    torch.manual_seed(0)
    model = namespace["Model"](*namespace["get_init_inputs"]()).to(device)
    torch.manual_seed(1)
    inputs = [x.to(device) if isinstance(x, torch.Tensor) else x for x in namespace["get_inputs"]()]
    return model, inputs


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def measure(source: str, device: str, trials: int) -> dict:
    model, inputs = _build(source, device)
    with torch.no_grad():
        out = model(*inputs)
        again = model(*inputs)
        times = []
        for _ in range(trials):
            _sync(device)
            start = time.perf_counter()
            model(*inputs)
            _sync(device)
            times.append((time.perf_counter() - start) * 1000.0)
    return {
        "median_ms": statistics.median(times),
        "peak_mib": torch.cuda.max_memory_allocated() / 2**20 if device == "cuda" else None,
        "out_shape": list(out.shape),
        "out_finite": bool(torch.isfinite(out).all()),
        "deterministic": bool(torch.allclose(out, again, rtol=1e-5, atol=1e-5)),
    }


def main() -> None:
    device, trials = sys.argv[1], int(sys.argv[2])
    torch.set_num_threads(1)
    for item in json.load(sys.stdin):
        result = {"id": item["id"], "ok": True, "error": ""}
        try:
            result.update(measure(item["source"], device, trials))
        except Exception as exc:  # report and go on: one broken problem must not hide the others
            result.update(ok=False, error=f"{type(exc).__name__}: {exc}")
        if device == "cuda":
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
        print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
