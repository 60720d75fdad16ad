"""Sandboxed KernelBench evaluator: scores a candidate `ModelNew` against a reference `Model`."""
