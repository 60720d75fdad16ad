"""What the commitment of a timed block costs on a GPU: `output_digest.block_sketches` (a BLAKE2s tree over every
call's output, chunk_hash.cu) for blocks of calls of several output sizes, against the old sum of the raw bits, and
the service's hashlib hash of one saved output. Run on a CUDA machine: `python bench/sketch_gpu.py --out FILE`."""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from services.evaluator import output_digest

# (bytes of one call's output, calls in the block)
CASES = [(4 << 10, 200), (1 << 20, 64), (64 << 20, 8), (1 << 30, 2)]


def _seconds(function, repeats: int = 7) -> float:  # noqa: ANN001
    samples = []
    for _ in range(repeats):
        torch.cuda.synchronize()
        start = time.perf_counter()
        function()
        torch.cuda.synchronize()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def _bit_sums(outputs: list[torch.Tensor]) -> list[int]:
    """The sketch before the hash, for comparison: the exact sum of each output's 32-bit words."""
    return [int(v) for v in torch.stack([o.view(torch.int32).sum(dtype=torch.int64) for o in outputs]).tolist()]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    started = time.perf_counter()
    output_digest.prepare("cuda")
    rows = [{"compile_s": time.perf_counter() - started, "device": torch.cuda.get_device_name()}]
    for nbytes, calls in CASES:
        outputs = [torch.randn(nbytes // 4, device="cuda") for _ in range(calls)]
        hashed = _seconds(lambda outputs=outputs: output_digest.block_sketches(outputs))
        summed = _seconds(lambda outputs=outputs: _bit_sums(outputs))
        saved = outputs[0].cpu()
        service = _seconds(lambda saved=saved: output_digest.output_sketch(saved), repeats=3)
        hashed_gb_s = nbytes * calls / hashed / 1e9
        rows.append(
            {
                "output_bytes": nbytes,
                "calls": calls,
                "hash_ms_per_call": hashed / calls * 1e3,
                "hash_GB_per_s": hashed_gb_s,
                "sum_ms_per_call": summed / calls * 1e3,
                "service_hash_ms": service * 1e3,
            }
        )
        print(json.dumps(rows[-1]), flush=True)  # noqa: T201
        del outputs
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
