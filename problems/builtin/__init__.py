"""Built-in KernelBench-format problems, one per file.

These files are data: `problems.registry` reads them as text and never imports them.
"""
