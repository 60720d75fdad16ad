"""Run in a subprocess by test_gpu_kernels.py: build a candidate and its reference on CUDA, compare outputs.

usage: python -m tests.implementer.gpu_check REFERENCE.py CANDIDATE.py [TOLERANCE] -> prints one JSON line
(TOLERANCE: atol and rtol of the comparison, default 1e-4, the evaluator's for float32)
"""

from __future__ import annotations

import importlib.util
import json
import sys
import time

import torch


def _load(path: str, name: str):  # noqa: ANN202
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main() -> None:
    reference, candidate = _load(sys.argv[1], "reference"), _load(sys.argv[2], "candidate")
    tolerance = float(sys.argv[3]) if len(sys.argv) > 3 else 1e-4
    torch.manual_seed(0)
    init = reference.get_init_inputs()
    torch.manual_seed(0)
    ref_model = reference.Model(*init).cuda()
    torch.manual_seed(0)
    new_model = candidate.ModelNew(*init).cuda()
    worst = 0.0
    with torch.no_grad():
        for trial in range(3):
            torch.manual_seed(1 + trial)
            inputs = [t.cuda() if isinstance(t, torch.Tensor) else t for t in reference.get_inputs()]
            expected = ref_model(*inputs)
            got = new_model(*[t.clone() if isinstance(t, torch.Tensor) else t for t in inputs])
            torch.cuda.synchronize()
            worst = max(worst, (expected.float() - got.float()).abs().max().item())
            ok = torch.allclose(expected.float(), got.float(), atol=tolerance, rtol=tolerance)
            if not ok:
                break
        timings = {}
        for label, model in (("reference", ref_model), ("candidate", new_model)):
            for _ in range(3):
                model(*inputs)
            torch.cuda.synchronize()
            start = time.perf_counter()
            for _ in range(20):
                model(*inputs)
            torch.cuda.synchronize()
            timings[label] = (time.perf_counter() - start) / 20 * 1000
    print(json.dumps({"correct": ok, "max_abs_error": worst, **timings}))


if __name__ == "__main__":
    main()
