"""The judge against candidates written to game it, on a real server: each one of the ways a candidate's process
could make a verdict rest on what it says, and what the judge answers instead. After each, an honest candidate
is still scored correct."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from services.evaluator.config import HACK_FLAGS
from tests.evaluator import sources
from tests.evaluator.conftest import REFERENCE, evaluate
from tests.evaluator.test_hostile import assert_still_correct

# Looks for the reference model in its own process (it used to be timed there) and slows every one it finds.
SLOW_THE_REFERENCE = sources.candidate(
    """
import gc, time
if not SEARCHED:
    SEARCHED.append(True)
    for obj in gc.get_objects():
        if isinstance(obj, torch.nn.Module) and type(obj).__name__ == "Mod" + "el":  # spelled so the static check lets it run
            obj.forward = lambda *args, _f=obj.forward: (time.sleep(0.002), _f(*args))[1]
return x.clamp_min(0) * self.scale
""",
    prelude="SEARCHED = []",
)

# Burns the CPU from threads while it is not being called, to slow down whatever is timed meanwhile.
BACKGROUND_SPINNERS = sources.candidate(
    "return x.clamp_min(0) * self.scale",
    prelude="""
import threading

def _spin():
    while True:
        sum(range(1000))

for _ in range(4):
    threading.Thread(target=_spin, daemon=True).start()
""",
)

# Arms one-shot POSIX timers that send the process SIGCONT 1 ms to 9 s after each call, and spins in a thread: the
# kernel would resume it after the judge stopped it (after a block's reply, or beside the reference's block) without
# any of its processes running at the stop.
SIGCONT_TIMER = sources.candidate(
    """
for timer, arm in zip(_TIMERS, _ARMS):
    _LIBC.timer_settime(timer, 0, ctypes.byref(arm), None)
return x.clamp_min(0) * self.scale
""",
    prelude="""
import ctypes, signal, threading

class _Event(ctypes.Structure):  # struct sigevent: value, signo, notify (SIGEV_SIGNAL = 0), padding
    _fields_ = [("value", ctypes.c_void_p), ("signo", ctypes.c_int), ("notify", ctypes.c_int), ("pad", ctypes.c_byte * 48)]

class _Time(ctypes.Structure):
    _fields_ = [("sec", ctypes.c_long), ("nsec", ctypes.c_long)]

class _Spec(ctypes.Structure):
    _fields_ = [("interval", _Time), ("value", _Time)]

_LIBC = ctypes.CDLL(None, use_errno=True)
# One-shot timers 1 ms to 9 s after each call, each a quarter later than the one before, so that one falls inside
# the judge's stop however late after the last call it begins (with eight from 1 to 128 ms, one CI run ended with
# only `implausible_timing`: a stop that began later than 128 ms would have missed them all).
_ARMS = [_Spec(_Time(0, 0), _Time(*divmod(int(1e6 * 1.25**i), 10**9))) for i in range(42)]
_TIMERS = [ctypes.c_void_p() for _ in _ARMS]
for _timer in _TIMERS:
    if _LIBC.timer_create(1, ctypes.byref(_Event(None, signal.SIGCONT, 0)), ctypes.byref(_timer)) != 0:
        raise OSError(ctypes.get_errno(), "timer_create")

def _spin():
    while True:
        sum(range(1000))

threading.Thread(target=_spin, daemon=True).start()
""",
)

# Caches its answer per input buffer: right the first time, stale once the same buffer holds new values.
CACHE_PER_BUFFER = sources.candidate(
    """
key = (x.data_ptr(), tuple(x.shape))
if key not in CACHE:
    CACHE[key] = x.clamp_min(0) * self.scale
return CACHE[key]
""",
    prelude="CACHE = {}",
)

# Computes while its outputs are written for correctness, answers from memory once it sees it is being timed.
STACK_SNIFFER = sources.candidate(
    """
import inspect
names = {frame.function for frame in inspect.stack()}
if "serve_timing" in names and LAST:
    return LAST[-1]
LAST.append(x.clamp_min(0) * self.scale)
return LAST[-1]
""",
    prelude="LAST = []",
)

# Returns a tensor subclass, the kind of object that could compute only when it is read after the timed call.
SUBCLASS_OUTPUT = sources.candidate(
    "return (x.clamp_min(0) * self.scale).as_subclass(Lazy)",
    prelude="class Lazy(torch.Tensor):\n    pass",
)

# Replaces the worker's timer (a class attribute) so every call reports a microsecond, and hides it from the guard.
PATCHED_TIMER_METHOD = sources.candidate(
    "return x.clamp_min(0) * self.scale",
    prelude="""
import time
from services.evaluator.backends.cpu import CpuBackend

def _fast(self, fn, args):
    out = fn(*args)
    time.sleep(0.0005)
    return 0.001, out

CpuBackend.time_call = _fast
import services.evaluator.runner as _blind
_blind._replaced = lambda guard: []  # the guard silenced
""",
)

# Rebinds the clock the worker bound at import, and clears the guard's report.
PATCHED_BOUND_CLOCK = sources.candidate(
    "return x.clamp_min(0) * self.scale",
    prelude="""
import time
from services.evaluator.backends import cpu

_real = time.perf_counter
cpu._perf_counter = lambda: _real() * 0.001
import services.evaluator.runner as _blind
_blind._replaced = lambda guard: []  # the guard silenced
""",
)

# Raises if it is ever called on inputs it has seen before: content memoisation (answers cached by the inputs'
# bytes) would pay off there. Timed calls draw fresh inputs, so it never raises.
NEVER_THE_SAME_INPUTS = sources.candidate(
    """
key = hash(x.detach().cpu().numpy().tobytes())
if key in SEEN:
    raise RuntimeError("called twice on the same inputs: an answer cached by content would be reused here")
SEEN.add(key)
return x.clamp_min(0) * self.scale
""",
    prelude="SEEN = set()",
)

# Takes over the worker's timing loop (hidden from the guard: what stops it must be the judge). It reports a tenth
# of a microsecond per call; __BLOCK__ is what it does in a block, __SKETCHED__ the outputs its reply commits to
# (output_digest.block_sketches), __DIGEST__ its digest of the block's outputs (and of the inputs, drawn again).
_TAKEOVER = """
import torch
import services.evaluator.runner as _runner

import services.evaluator.runner as _blind
_blind._replaced = lambda guard: []  # the guard silenced

def _serve(context, model, inputs, guard):
    seeds, outputs, one_set = [], [], None
    while True:
        command = context.command()
        op = command.get("op")
        if op == "draw":
            seeds = [int(s) for s in command["seeds"]]
            context.emit("drawn", nonce=command["nonce"])
        elif op == "block":
            # The re-check's one set: a file handed over (`set`) or a trial drawn from its seed (`trial_seed`).
            one_set = command if "set" in command or "trial_seed" in command else None
            calls = 1 if one_set is not None else len(seeds)
            with torch.no_grad():
                outputs = __BLOCK__
                sketches = _runner.output_digest.block_sketches(__SKETCHED__)
            context.emit("block", nonce=command["nonce"], ms=[0.0001] * calls, sketches=sketches)
        elif op == "digest":
            with torch.no_grad():
                digest = _runner.output_digest.block_digest(__DIGEST__, int(command["seed"]))
                # The inputs as drawn, which its calls (if any) left unchanged.
                untouched = [_runner.input_tensors(inputs.draw(s)) for s in seeds]
                inputs_digest = _runner.output_digest.sets_digest(untouched, int(command["seed"]))
            context.emit("digested", nonce=command["nonce"], digest=digest, inputs_digest=inputs_digest)
        elif op == "save":
            call = int(command["call"])
            values = inputs.one_set(one_set) if one_set is not None else inputs.draw(seeds[call])
            with torch.no_grad():
                out = model(*inputs.checked(values))
            directory = context.home / "checks" / str(int(command["check"]))
            directory.mkdir(parents=True)
            torch.save({"outputs": out, "inputs_after": []}, directory / "0.pt")
            context.emit("saved", nonce=command["nonce"])
        else:
            context.emit("done", replaced=[])
            return

_runner.serve_timing = _serve
"""
_COMPUTED = "[model(*inputs.checked(inputs.draw(s))) for s in seeds]"


_ZEROS = "[torch.zeros(64, 64)] * calls"


def _takeover(block: str, sketched: str, digest: str) -> str:
    prelude = _TAKEOVER.replace("__BLOCK__", block).replace("__SKETCHED__", sketched).replace("__DIGEST__", digest)
    return sources.candidate("return x.clamp_min(0) * self.scale", prelude=prelude)


# Computes nothing in a block, and sketches and digests zeros.
IDLE_TAKEOVER = _takeover("[]", _ZEROS, "[torch.zeros(64, 64)] * len(seeds)")
# Computes nothing in a block (its sketches are of zeros), and the outputs only when the digest asks for them.
LAZY_TAKEOVER = _takeover("[]", _ZEROS, _COMPUTED)
# Draws the inputs only in the block and computes every output there: true sketches and digests, false reports.
WORKING_TAKEOVER = _takeover(_COMPUTED, "outputs", "outputs")

# Returns bfloat16-rounded outputs from every call (errors far beyond float32's tolerance, which cancel in a block's
# digest), and the exact output of whichever call the judge saves for a full check: the save converts the output with
# the runner's to_plain, which it replaces (hidden from the guard). Timed honestly, so only the outputs are false.
LOW_PRECISION_TIMED = sources.candidate(
    """
exact = x.clamp_min(0) * self.scale
out = exact.bfloat16().float()
_EXACT[id(out)] = exact
weakref.finalize(out, _EXACT.pop, id(out), None)
return out
""",
    prelude="""
import weakref
import services.evaluator.runner as _runner

import services.evaluator.runner as _blind
_blind._replaced = lambda guard: []  # the guard silenced
_EXACT = {}
_to_plain = _runner.to_plain
_runner.to_plain = lambda value, exact=False: _to_plain(_EXACT.get(id(value), value), exact)
""",
)

# Computes nothing in its timed calls (found on the stack), and every output only when the digest asks for it: the worker's digest is
# replaced (output_digest.block_digest, a module the worker uses by name) by one that first fills each output in
# full, then digests it as the worker would. The guard is blinded (its process can do that), so what must stop it
# is the commitment each block's reply carries: the sketch of every call's whole output when the block ended.
DIGEST_FILLS_OUTPUTS = sources.candidate(
    """
frame = sys._getframe()
while frame is not None and frame.f_code.co_name != "serve_timing":
    frame = frame.f_back
if frame is None:  # the correctness run: computed
    return x.clamp_min(0) * self.scale
out = torch.empty_like(x)
_PENDING[id(out)] = (out, x.clone(), self.scale)
return out
""",
    prelude="""
import sys
import services.evaluator.output_digest as _digest
import services.evaluator.runner as _runner

import services.evaluator.runner as _blind
_blind._replaced = lambda guard: []  # the guard silenced
_PENDING = {}
_original = _digest.block_digest

_to_plain = _runner.to_plain

def _fill(out):
    pending = _PENDING.pop(id(out), None)
    if pending is not None:
        pending[0].copy_(pending[1].clamp_min(0) * pending[2])
    return out

def _filling_digest(outputs, seed):
    return _original([_fill(out) for out in outputs], seed)

_digest.block_digest = _filling_digest
_runner.to_plain = lambda value, exact=False: _to_plain(_fill(value), exact)  # the re-check has no digest
""",
)

# What the guard must name, each silenced the old way (the class attribute rebound): the clock the backend bound,
# the worker's digest, and the command pipe's readline on the worker's context (a peek at the judge's commands).
GUARD_REBOUND_CLOCK = PATCHED_BOUND_CLOCK.replace(
    "_blind._replaced = lambda guard: []", "_blind.Guard.replaced = lambda self: []"
)
GUARD_REPLACED_DIGEST = DIGEST_FILLS_OUTPUTS.replace(
    "_blind._replaced = lambda guard: []", "_blind.Guard.replaced = lambda self: []"
)
GUARD_SHADOWED_READLINE = sources.candidate(
    "return x.clamp_min(0) * self.scale",
    prelude="""
import gc
import services.evaluator.runner as _runner

_runner.Guard.replaced = lambda self: []
for _obj in gc.get_objects():
    if type(_obj) is _runner.WorkerContext:
        _obj.control.readline = lambda *args, _read=_obj.control.readline: _read(*args)
""",
)

# Points its output directory at another directory after the first call, so the service would read elsewhere.
# A red-team candidate (it scored correct with no flag at 5.5x and 9.3x when only the CPU time of the draw was
# compared): the guard silenced, and the worker's draw wrapped so that a helper process, told the seeds, draws the
# same inputs and computes every output of the block into memory shared with the worker while the worker draws;
# the helper then forks its successor and exits before the reply, taking its CPU time with it (the kernel reaps
# it). Each timed call does a quarter of the work (so the judge's clock resolves it) and returns the helper's
# answer for its inputs; the correctness run and the re-check are computed. `_OFFLOADED` of every 20 blocks do this,
# the others are honest: just over half sets the median of the samples, and so the speedup.
DRAW_OFFLOAD = """
import collections, mmap, os, select, signal
_OFFLOADED = {offloaded}
_BLOCKS = []
import torch
import services.evaluator.runner as _runner
_runner._replaced = lambda guard: []
signal.signal(signal.SIGCHLD, signal.SIG_IGN)
_SETS = 64
_OUTPUTS = torch.frombuffer(mmap.mmap(-1, _SETS * 512 * 512 * 4), dtype=torch.float32).view(_SETS, 512, 512)
_GO, _TELL = os.pipe()
_WAIT, _DONE = os.pipe()
_READY = collections.deque()
_SCALE = []

def _f(x):
    for _ in range(10):
        x = torch.sin(x) + x * 0.5
    return x

def _helper(sets):
    torch.set_num_threads(1)
    seeds = os.read(_GO, 8 * _SETS)
    for i in range(len(seeds) // 8):
        (x,) = sets.draw(int.from_bytes(seeds[8 * i : 8 * i + 8], "little"))  # unsigned, as a CPU's draws are
        _OUTPUTS[i].copy_(torch.relu(_f(x)) * _SCALE[0])
    if os.fork() == 0:
        _helper(sets)
    os.write(_DONE, os.getpid().to_bytes(4, "little"))
    os._exit(0)

_draw_all = _runner.InputSets.draw_all

def _offloaded_draw(self, seeds, signed=False):
    _BLOCKS.append(len(_BLOCKS))
    if _BLOCKS[-1] % 20 >= _OFFLOADED:
        _READY.clear()
        return _draw_all(self, seeds, signed)
    if not _SCALE[1:]:
        _SCALE.append("helper started")
        if os.fork() == 0:
            _helper(self)
    seeds = seeds[:_SETS]
    os.write(_TELL, b"".join(int(s).to_bytes(8, "little") for s in seeds))
    _draw_all(self, seeds, signed)
    try:
        helper = os.pidfd_open(int.from_bytes(os.read(_WAIT, 4), "little"))
    except ProcessLookupError:
        pass  # gone already (on a loaded machine it can exit and be reaped first)
    else:
        select.select([helper], [], [])  # readable once it is gone, and its CPU time with it
        os.close(helper)
    _READY.clear()
    for i, values in enumerate(self.drawn):
        _READY.append((values[0].flatten()[:8].clone(), _OUTPUTS[i]))

_runner.InputSets.draw_all = _offloaded_draw

class ModelNew(torch.nn.Module):
    def __init__(self, scale):
        super().__init__()
        self.scale = scale
        _SCALE.append(scale)

    def forward(self, x):
        if _READY and torch.equal(x.flatten()[:8], _READY[0][0]):
            _f(x[: x.shape[0] // 4])
            return _READY.popleft()[1].clone()
        return torch.relu(_f(x)) * self.scale
"""

# A red-team candidate: in every other timed call, `forward` copies its input into shared memory and returns a shared
# output buffer at once (the reported time is ~0.1 ms); a profile hook fires when the runner's `time_call` returns,
# after the time is taken, and has a helper process compute that output while the main thread sleeps. The helper forks
# its successor and exits before the block's reply, taking its CPU time with it, so the judge's CPU clock sees almost
# nothing beyond the report; the block's wall time does. Correct at 1.9-8.8x in 9 of 9 runs on the CPU clock alone.
AFTER_CALL_HELPERS = """
import mmap, os, select, signal, sys
import torch
signal.signal(signal.SIGCHLD, signal.SIG_IGN)
_IN = torch.frombuffer(mmap.mmap(-1, 512 * 512 * 4), dtype=torch.float32).view(512, 512)
_SLOTS = 64
_OUT = torch.frombuffer(mmap.mmap(-1, _SLOTS * 512 * 512 * 4), dtype=torch.float32).view(_SLOTS, 512, 512)
_GO_R, _GO_W = os.pipe()
_DONE_R, _DONE_W = os.pipe()
_STATE = {"calls": 0, "slot": 0}

def _f(x):
    for _ in range(10):
        x = torch.sin(x) + x * 0.5
    return x

def _helper(scale):
    torch.set_num_threads(1)
    slot = int.from_bytes(os.read(_GO_R, 4), "little")
    torch.mul(torch.relu(_f(_IN)), scale, out=_OUT[slot])
    if os.fork() == 0:
        _helper(scale)
    os.write(_DONE_W, os.getpid().to_bytes(4, "little"))
    os._exit(0)

def _after_the_timed_call(slot):
    def hook(frame, event, arg):
        if event == "return" and frame.f_code.co_name == "time_call":
            sys.setprofile(None)
            os.write(_GO_W, slot.to_bytes(4, "little"))
            pid = int.from_bytes(os.read(_DONE_R, 4), "little")
            if os.path.exists(f"/proc/{pid}"):
                helper = os.pidfd_open(pid)
                select.select([helper], [], [])  # readable once it is gone, and its CPU time with it
                os.close(helper)
    return hook

def _timed():
    frame = sys._getframe(2)
    for _ in range(6):
        if frame is None:
            return False
        if frame.f_code.co_name == "time_call":
            return True
        frame = frame.f_back
    return False

class ModelNew(torch.nn.Module):
    def __init__(self, scale):
        super().__init__()
        self.scale = scale
        if os.fork() == 0:
            _helper(scale)

    def forward(self, x):
        if _timed():
            _STATE["calls"] += 1
            if _STATE["calls"] % 2:
                slot = _STATE["slot"]
                _STATE["slot"] = (slot + 1) % _SLOTS
                _IN.copy_(x)
                sys.setprofile(_after_the_timed_call(slot))
                return _OUT[slot]
        return torch.relu(_f(x)) * self.scale
"""

SYMLINKED_OUTPUTS = sources.candidate(
    """
import os
if os.path.isdir("out") and not os.path.islink("out"):
    os.rename("out", "elsewhere")
    os.symlink("elsewhere", "out")
return x.clamp_min(0) * self.scale
""",
)

# An output of a hundred thousand leaves: the comparison must stay bounded and blame the candidate.
MANY_LEAVES = sources.candidate("return tuple([x.clamp_min(0) * self.scale] * 100_000)")

# Writes a `built` event for a key of its choosing, with a library file of its own beside it.
FORGED_BUILD_EVENTS = sources.candidate(
    "return x.clamp_min(0) * self.scale",
    prelude="""
import os
_line = b'{"event": "built", "key": "' + b"a" * 64 + b'", "files": {"ext_aaaaaaaaaaaaaaaaaaaaaaaa.so": "0"}}\\n'
os.makedirs("build/" + "a" * 64, exist_ok=True)
open("build/" + "a" * 64 + "/ext_aaaaaaaaaaaaaaaaaaaaaaaa.so", "wb").write(b"not a library")
for _fd in os.listdir("/proc/self/fd"):
    try:
        if int(_fd) > 2 and os.readlink(f"/proc/self/fd/{_fd}").startswith("pipe:"):
            os.write(int(_fd), _line)
    except OSError:
        pass
""",
)

# Writes its own timing reply while the judge waits for the worker's: a reply with a nonce it cannot know.
FORGED_REPLY_MID_BLOCK = sources.candidate(
    """
import os
for _fd in os.listdir("/proc/self/fd"):
    try:
        if int(_fd) > 2 and os.readlink(f"/proc/self/fd/{_fd}").startswith("pipe:"):
            os.write(int(_fd), b'{"event": "block", "nonce": "guess", "ms": [0.0001]}\\n')
    except OSError:
        pass
return x.clamp_min(0) * self.scale
""",
)


# Swaps the service's `inputs` directory for one of its own, with a link where the re-check set will be written:
# a service writing by path, as root, would overwrite the link's target outside the sandbox.
INPUTS_SWAP = sources.candidate(
    """
import os
CALLS.append(1)
if len(CALLS) == 2 and os.path.isdir("inputs") and not os.path.islink("inputs"):
    os.rename("inputs", "inputs_orig")
    os.mkdir("inputs", 0o755)
    for name in os.listdir("inputs_orig"):
        os.symlink("../inputs_orig/" + name, "inputs/" + name)
    for trial in range(2, 8):
        os.symlink(TARGET, f"inputs/inputs_{trial}.pt")
return x.clamp_min(0) * self.scale
""",
    prelude="CALLS = []\nTARGET = '__TARGET__'",
)

# A line nested 200,000 deep on the events pipe: the service's JSON reader must not fail with it.
DEEP_EVENT = sources.candidate(
    "return x.clamp_min(0) * self.scale",
    prelude="""
import os, sys
os.write(int(sys.argv[sys.argv.index("--events-fd") + 1]), b"[" * 200_000 + b"\\n")
""",
)


def test_an_output_forged_within_the_tolerance_is_caught_on_the_cpu(any_client: httpx.Client) -> None:
    """A sum of the output's raw bits as the commitment let this candidate through; the check of the bytes the judge
    copied from the worker's memory when the block ended does not: its timed calls returned zeros, whatever its
    replaced save would have written (on a GPU: test_gpu_service.py)."""
    result = evaluate(
        any_client, sources.SKETCH_FORGED_WITHIN_TOLERANCE, sources.HEAVY_REFERENCE, timing_trials=20, timeout_s=240
    )
    assert result["status"] == "rejected" and "stale_output" in result["flags"], result
    assert_still_correct(any_client)


def assert_draw_flagged_or_charged(result: dict[str, Any]) -> None:
    """Work moved into the draw by helpers that exit: where the job has a cgroup (strict isolation here) their CPU
    time stays on the judge's clock and the draw's excess is counted in the samples, which leaves no speed beyond an
    honest copy's (about 1x; 0.28x and 0.50x in one run); where it has none it leaves with them, and the draw's
    time off the CPU is flagged. The helper tests ask for the CPU: on a GPU host `auto` picks CUDA, where these
    forked helpers working on host memory end the candidate in `runtime_error` (an H200 run). Helpers still at work when the block starts are seen there instead (hides_work: in
    one CI run, strict, the judge's clock left 5.9 ms per block unexplained against the reference's 3.7)."""
    if result["status"] == "correct":
        assert "charged_outside_calls" in result["flags"] and result["speedup"] < 1.5, result
    else:
        assert result["status"] == "rejected" and "implausible_timing" in result["flags"], result
        moved = ("drawing the inputs", "work off the timed stream")
        assert any(reason in result["message"] for reason in moved), result["message"]


def test_answers_computed_by_helpers_while_the_inputs_are_drawn_buy_no_speed(any_client: httpx.Client) -> None:
    candidate = DRAW_OFFLOAD.format(offloaded=20)
    result = evaluate(any_client, candidate, sources.HEAVY_REFERENCE, timing_trials=20, timeout_s=240, device="cpu")
    assert_draw_flagged_or_charged(result)
    assert_still_correct(any_client)


def test_outputs_computed_by_helpers_after_the_timed_call_returned_are_seen(any_client: httpx.Client) -> None:
    """The helper's CPU time leaves with it (mostly: the judge's clock saw the work in some runs, in the block or in
    the draw that follows); the block's wall time does not. Correct at 3.7x and 6.3x here before the wall clock."""
    result = evaluate(
        any_client, AFTER_CALL_HELPERS, sources.HEAVY_REFERENCE, timing_trials=20, timeout_s=240, device="cpu"
    )
    assert result["status"] == "rejected" and "implausible_timing" in result["flags"], result


def test_answers_computed_while_the_inputs_are_drawn_in_just_over_half_of_few_blocks_buy_no_speed(
    any_client: httpx.Client,
) -> None:
    """11 of 20 blocks: the median is theirs, but the ranks of all pairs are not (z of about 2.96 against 3.09); it
    scored correct at 4-18x in 7 of 9 runs. The slowest draws of both sides are the candidate's, 11 in a row, and
    each of those blocks is charged its own draw."""
    candidate = DRAW_OFFLOAD.format(offloaded=11)
    result = evaluate(any_client, candidate, sources.HEAVY_REFERENCE, timing_trials=20, timeout_s=240, device="cpu")
    assert_draw_flagged_or_charged(result)


def test_a_swapped_inputs_directory_never_makes_the_service_write_elsewhere(any_client: httpx.Client, tmp_path) -> None:  # noqa: ANN001
    victim = tmp_path / "victim.txt"
    victim.write_text("untouched")
    victim.chmod(0o600)
    result = evaluate(any_client, INPUTS_SWAP.replace("__TARGET__", str(victim)), timing_trials=10)
    assert victim.read_text() == "untouched" and victim.stat().st_mode & 0o777 == 0o600
    assert result["status"] in {"rejected", "runtime_error", "incorrect"}, result
    assert_still_correct(any_client)


def test_a_line_too_deep_to_parse_is_the_candidates_problem(any_client: httpx.Client) -> None:
    result = evaluate(any_client, DEEP_EVENT)
    assert result["status"] != "evaluator_error", result["message"]
    assert_still_correct(any_client)


def test_reference_is_out_of_the_candidates_reach(any_client: httpx.Client) -> None:
    result = evaluate(any_client, SLOW_THE_REFERENCE)
    assert result["status"] == "correct", result["message"]
    assert result["speedup"] < 3, result


def test_background_threads_cannot_slow_the_reference(any_client: httpx.Client) -> None:
    result = evaluate(any_client, BACKGROUND_SPINNERS)
    # On two cores the spinners also hold the GIL in the candidate's own calls, which can then run past the time
    # limit: a slow candidate, scored as one. What must never happen is a speedup bought with the reference's time.
    assert result["status"] in {"correct", "rejected", "timeout"}, result["message"]
    if result["status"] == "correct":
        assert result["speedup"] < 2, result
    assert_still_correct(any_client)


# A 16 MiB output of zeros but its diagonal, which the reference allocates and zeroes at every call.
DIAGONAL_REFERENCE = """
import torch

class Model(torch.nn.Module):
    def __init__(self, scale):
        super().__init__()
        self.scale = scale

    def forward(self, x):
        return torch.diag_embed(torch.relu(x) * self.scale)

def get_inputs():
    return [torch.randn(16, 512)]

def get_init_inputs():
    return [2.0]
"""

# Keeps every output it returns and, once the runner has let one go, returns it again with only its diagonal
# written: its zeros are still there from the first time. No code of the runner's touched, no guard silenced: a red-team
# candidate of this kind scored `correct` at 10.6-11.4x before the judge overwrote each output it had used.
RETURNED_BUFFERS_REUSED = sources.candidate(
    """
shape = (*x.shape, x.shape[-1])
for out in _RETURNED:
    if sys.getrefcount(out) == 3 and out.shape == shape:  # held by the list, this loop and the call alone
        out.diagonal(dim1=-2, dim2=-1).copy_(torch.relu(x) * self.scale)
        return out
out = torch.diag_embed(torch.relu(x) * self.scale)
_RETURNED.append(out)
return out
""",
    prelude="import sys\n\n_RETURNED = []",
)

# Zero-fills fresh output buffers once its digest is done, while the judge checks the block, from a thread that
# watches the main thread's stack; the next block's calls then write only the diagonal into one. A red-team candidate
# of this kind scored `correct` at 11.5-12.0x while the candidate saved the checked output itself and ran free until
# its next block, and this one at 7.4x (strict) and 2.4x (process) here, and 2.3x on CI's machine in strict isolation
# once the save was clocked against the timer's.
OUTPUTS_PREPARED_AFTER_THE_DIGEST = """
import sys
import threading
import time
import torch

_READY = []
_SHAPE = (16, 1024, 1024)
_CALLS = [0, 0]  # calls since the last check; calls before it


def _names(frame):
    names = set()
    while frame is not None:
        names.add(frame.f_code.co_name)
        frame = frame.f_back
    return names


def _prepare():
    main, digesting, armed = threading.main_thread().ident, False, False
    while True:
        names = _names(sys._current_frames().get(main))
        if "block_digest" in names and not digesting:
            digesting = True
            _CALLS[:] = [0, _CALLS[0]]
        elif "block_digest" not in names and digesting:  # replied: the judge checks the block, then the next draw
            digesting, armed = False, True
        if names & {"draw_all", "forward"}:
            armed = False
        if armed and len(_READY) < _CALLS[1]:
            _READY.append(torch.empty(_SHAPE).zero_())
        else:
            time.sleep(0.0005)


threading.Thread(target=_prepare, daemon=True).start()


class ModelNew(torch.nn.Module):
    def __init__(self, scale):
        super().__init__()
        self.scale = scale

    def forward(self, x):
        _CALLS[0] += 1
        if _READY and tuple(x.shape) == _SHAPE[:2]:
            out = _READY.pop()
            out.diagonal(dim1=-2, dim2=-1).copy_(torch.relu(x) * self.scale)
            return out
        return torch.diag_embed(torch.relu(x) * self.scale)
"""


# DIAGONAL_REFERENCE with a 64 MiB output: its calls, not the work around them, take most of a block.
LARGE_DIAGONAL_REFERENCE = DIAGONAL_REFERENCE.replace("torch.randn(16, 512)", "torch.randn(16, 1024)")


# The reference each gamed candidate is scored against, where it is not the default one.
REFERENCE_OF = {"returned_buffers_reused": DIAGONAL_REFERENCE}


@pytest.mark.parametrize(
    ("name", "candidate", "verdicts"),
    [
        ("cache_per_buffer", CACHE_PER_BUFFER, {"incorrect", "rejected"}),
        ("stack_sniffer", STACK_SNIFFER, {"rejected"}),
        ("subclass_output", SUBCLASS_OUTPUT, {"runtime_error", "incorrect", "rejected"}),
        ("patched_timer_method", PATCHED_TIMER_METHOD, {"rejected"}),
        ("forged_reply_mid_block", FORGED_REPLY_MID_BLOCK, {"rejected"}),
        ("symlinked_outputs", SYMLINKED_OUTPUTS, {"incorrect", "runtime_error"}),
        ("many_leaves", MANY_LEAVES, {"incorrect", "runtime_error"}),
        ("idle_takeover", IDLE_TAKEOVER, {"rejected"}),
        ("lazy_takeover", LAZY_TAKEOVER, {"rejected"}),
        ("low_precision_timed", LOW_PRECISION_TIMED, {"rejected"}),
        ("digest_fills_outputs", DIGEST_FILLS_OUTPUTS, {"rejected"}),
        ("returned_buffers_reused", RETURNED_BUFFERS_REUSED, {"rejected", "incorrect"}),
    ],
)
def test_gamed_timing_or_outputs_never_score(
    any_client: httpx.Client, name: str, candidate: str, verdicts: set[str]
) -> None:
    reference = REFERENCE_OF.get(name, REFERENCE)
    result = evaluate(any_client, candidate, reference, timing_trials=20, timeout_s=240)
    assert result["status"] in verdicts, f"{name}: {result['status']} {result['flags']} {result['message'][-600:]}"
    assert result["speedup"] is None
    assert_still_correct(any_client)


def test_outputs_prepared_while_a_block_is_checked_buy_no_speed(any_client: httpx.Client) -> None:
    """The judge copies the checked output from the candidate's memory itself, and the candidate stays stopped from
    its digest's reply to its next draw: what it fills after its digest is filled in the digest's time
    (`implausible_timing`), or not at all, and less than the flag's slack buys less than the room a report has."""
    result = evaluate(
        any_client, OUTPUTS_PREPARED_AFTER_THE_DIGEST, LARGE_DIAGONAL_REFERENCE, timing_trials=20, timeout_s=240
    )
    assert result["status"] in {"rejected", "correct"}, f"{result['status']} {result['message'][-600:]}"
    if result["status"] == "correct":
        assert result["speedup"] < 1.25, result
    else:
        assert "implausible_timing" in result["flags"], result
    assert_still_correct(any_client)


# Keeps one zero-filled output buffer and returns it from every call with only its diagonal written. The warm-up sees
# the shared memory and turns copies on; from then on the judge overwrites the runner's copies, never this buffer,
# whose zeros stay from the first call (a red team: `correct` at 1.59-2.22x in process isolation, honest 0.98-1.22x).
ONE_KEPT_BUFFER = sources.candidate(
    """
shape = (*x.shape, x.shape[-1])
if shape not in _KEPT:
    _KEPT[shape] = torch.zeros(shape, dtype=x.dtype)
out = _KEPT[shape]
out.diagonal(dim1=-2, dim2=-1).copy_(torch.relu(x) * self.scale)
return out
""",
    prelude="_KEPT = {}",
)


@pytest.mark.xfail(
    reason="open: one kept buffer is treated as a constant the candidate keeps (docs/evaluator.md, Not covered)",
    strict=False,  # its gain is within the noise in some runs
)
def test_one_kept_buffer_returned_at_every_call_buys_no_speed(any_client: httpx.Client) -> None:
    result = evaluate(any_client, ONE_KEPT_BUFFER, DIAGONAL_REFERENCE, timing_trials=20, timeout_s=240)
    assert result["status"] != "correct" or result["speedup"] < 1.25, result


# Source of a candidate's test for a call made in a timed block (the runner's `_time_drawn` on the stack).
IN_A_TIMED_BLOCK = """def _in_a_timed_block():
    frame = sys._getframe(1)
    while frame is not None:
        if frame.f_code.co_name == "_time_drawn":
            return True
        frame = frame.f_back
    return False
"""

# A red team's: in timed calls its output is wrong at one element off the diagonal, and a right clone of it is kept;
# os.write, which the guard does not watch, rewrites the block reply's regions to point at the clones, so the judge
# copies a clone for the check. Correct at 0.22-0.34x in the red team's runs: the clone is made in the timed calls.
REGIONS_POINT_AT_A_RIGHT_COPY = (
    """
import json
import os
import sys
import torch

_CLONES = {}
_write = os.write


"""
    + IN_A_TIMED_BLOCK
    + """

def _lying_write(fd, data):
    if isinstance(data, bytes | bytearray | memoryview) and bytes(data[:20]).startswith(b'{"event": "block"'):
        event = json.loads(bytes(data))
        if event.get("regions"):
            event["regions"] = [
                [[_CLONES[a][0], n] if a in _CLONES else [a, n] for a, n in call] for call in event["regions"]
            ]
            _write(fd, (json.dumps(event) + "\\n").encode())
            return len(data)
    return _write(fd, data)


class ModelNew(torch.nn.Module):
    def __init__(self, scale):
        super().__init__()
        self.scale = scale

    def forward(self, x):
        os.write = _lying_write
        out = torch.diag_embed(torch.relu(x) * self.scale)
        if _in_a_timed_block():
            clone = out.clone()
            while len(_CLONES) > 8:
                _CLONES.pop(next(iter(_CLONES)))
            _CLONES[out.data_ptr()] = (clone.data_ptr(), clone)
            out[0, 0, 1] = 12345.0
        else:
            _CLONES.clear()
        return out
"""
)


@pytest.mark.xfail(
    reason="open: where a CPU output lies is the worker's word (docs/evaluator.md, Not covered)", strict=False
)
def test_a_reply_that_points_the_check_at_a_right_copy_is_caught(any_client: httpx.Client) -> None:
    """It buys no speed (the copy is made in the timed calls), but its calls' outputs are wrong."""
    result = evaluate(any_client, REGIONS_POINT_AT_A_RIGHT_COPY, DIAGONAL_REFERENCE, timing_trials=20, timeout_s=240)
    assert result["status"] != "correct", result


# Returns a constant part of its output as one tensor it keeps, computed once: every call's output holds it.
CONSTANT_PART_REFERENCE = """
import torch

class Model(torch.nn.Module):
    def __init__(self, n):
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(n, n))

    def forward(self, x):
        return torch.relu(x) * 2, self.w.sum(0)

def get_inputs():
    return [torch.randn(256, 256)]

def get_init_inputs():
    return [256]
"""

CONSTANT_PART_KEPT = """
import torch

class ModelNew(torch.nn.Module):
    def __init__(self, n):
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(n, n))
        self.total = None

    def forward(self, x):
        if self.total is None:
            self.total = self.w.sum(0)
        return torch.relu(x) * 2, self.total
"""


def test_a_constant_output_the_candidate_keeps_is_not_overwritten(any_client: httpx.Client) -> None:
    """The judge overwrites the outputs it has used; one the candidate returns again is its own memory. A warm-up of
    one call saw no output returned twice, and the constant was overwritten (`stale_output`, 2 of 2 runs)."""
    result = evaluate_honest(any_client, CONSTANT_PART_KEPT, CONSTANT_PART_REFERENCE, warmup_trials=1)
    assert result["speedup"] is not None


# A reference that writes its answer into one buffer it keeps (an `out=` pattern) and returns it: every call of a
# block returns the same memory, which holds the last call's answer by the block's end.
OUTPUT_BUFFER_REFERENCE = """
import torch

class Model(torch.nn.Module):
    def __init__(self, n):
        super().__init__()
        self.register_buffer("out", torch.zeros(n, n))

    def forward(self, x):
        torch.matmul(x, x, out=self.out)
        return self.out

def get_inputs():
    return [torch.randn(384, 384)]

def get_init_inputs():
    return [384]
"""

FRESH_OUTPUT_REFERENCE = OUTPUT_BUFFER_REFERENCE.replace(
    "torch.matmul(x, x, out=self.out)\n        return self.out", "return torch.matmul(x, x)"
)

# A candidate that keeps a buffer of its own as the reference does and finds its timed block's loop (`_time_drawn`)
# from its frames: `{setup}` at the top, `{forward}` the body of its forward, which `_timed_block()` lets see the
# loop's names (None outside a timed block).
BUFFER_CANDIDATE = """
import sys
import torch

def _timed_block():
    frame = sys._getframe(2)
    while frame is not None:
        if frame.f_code.co_name == "_time_drawn":
            return frame.f_locals
        frame = frame.f_back
    return None

{setup}

class ModelNew(torch.nn.Module):
    def __init__(self, n):
        super().__init__()
        self.register_buffer("buf", torch.zeros(n, n))

    def forward(self, x):
{forward}
"""

# Computes only the last call of each timed block, and every call outside them: scored correct at 3.2-3.4x in both
# isolation levels when only that call's answer was left to check on both sides.
LAST_CALL_ONLY = BUFFER_CANDIDATE.format(
    setup="",
    forward="""\
        block = _timed_block()
        if block is None or len(block["times"]) == len(block["inputs"].drawn) - 1:
            torch.matmul(x, x, out=self.buf)
        return self.buf""",
)

# Two kept buffers in turn: a block's outputs share memory only once it holds more than two calls (the warm-up's
# blocks may not), which the judge learns in the middle of a timing round.
RING_BUFFER_REFERENCE = """
import torch

class Model(torch.nn.Module):
    def __init__(self, n):
        super().__init__()
        self.register_buffer("a", torch.zeros(n, n))
        self.register_buffer("b", torch.zeros(n, n))
        self.calls = 0

    def forward(self, x):
        out = self.a if self.calls % 2 == 0 else self.b
        self.calls += 1
        torch.matmul(x, x, out=out)
        return out

def get_inputs():
    return [torch.randn(128, 128)]

def get_init_inputs():
    return [128]
"""

SMALL_RING_CANDIDATE_S_REFERENCE = FRESH_OUTPUT_REFERENCE.replace("384", "32")
SMALL_RING_CANDIDATE = (
    RING_BUFFER_REFERENCE.replace("class Model(", "class ModelNew(")
    .replace('self.register_buffer("b", torch.zeros(n, n))', 'self.register_buffer("b", torch.zeros(n, n))\n'
             '        self.register_buffer("c", torch.zeros(n, n))')
    .replace("out = self.a if self.calls % 2 == 0 else self.b", "out = (self.a, self.b, self.c)[self.calls % 3]")
    .replace("128", "32")
)  # fmt: skip

# Once outputs are copied, returns a tensor subclass of its buffer whose copy computes the answer (its
# `__torch_function__` runs outside the timed call) and is a plain tensor.
LAZY_COPY = BUFFER_CANDIDATE.format(
    setup="""\
class Lazy(torch.Tensor):
    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        if func is torch.Tensor.clone and type(args[0]) is Lazy:
            x = args[0].__dict__["_x"]
            return torch.matmul(x, x)
        with torch._C.DisableTorchFunctionSubclass():
            return func(*args, **(kwargs or {}))""",
    forward="""\
        block = _timed_block()
        if block is not None and block.get("copy") is True:
            out = torch.Tensor._make_subclass(Lazy, self.buf)
            out.__dict__["_x"] = x
            return out
        torch.matmul(x, x, out=self.buf)
        return self.buf""",
)

# Once outputs are copied, returns its buffer untouched and computes each answer in the copy, through a torch function
# mode it pushed (the copy runs in its process): the time after its calls shows it.
MODE_IN_THE_COPY = BUFFER_CANDIDATE.format(
    setup="""\
from torch.overrides import TorchFunctionMode

PENDING = []

class _Mode(TorchFunctionMode):
    def __torch_function__(self, func, types, args=(), kwargs=None):
        if PENDING and getattr(func, "__name__", "") == "clone":
            x = PENDING.pop()
            return torch.matmul(x, x)
        return func(*args, **(kwargs or {}))

_Mode().__enter__()""",
    forward="""\
        block = _timed_block()
        if block is not None and block.get("copy") is True:
            PENDING.append(x)
            return self.buf
        torch.matmul(x, x, out=self.buf)
        return self.buf""",
)


# A memory-bound reference that returns a fresh 16 MB output: copying it costs about what computing it does.
OUTER_REFERENCE = """
import torch

class Model(torch.nn.Module):
    def __init__(self, n):
        super().__init__()

    def forward(self, x):
        return torch.outer(x, x)

def get_inputs():
    return [torch.randn(2048)]

def get_init_inputs():
    return [2048]
"""

# Keeps its output buffer, which turns the copies on, then computes half of each answer in its timed call and the
# other half in the copy, in place of copying that half: against OUTER_REFERENCE the copy's time matched the
# reference's, and it scored correct at 2.0-3.3x in both isolation levels while the copy was outside the calls.
# `{hook}` is how its code reaches the copy.
HALF_IN_THE_COPY = BUFFER_CANDIDATE.format(
    setup="""PENDING = []

def _finish(buf):
    x = PENDING.pop()
    half = x.shape[0] // 2
    out = torch.empty_like(buf)
    out[:half].copy_(buf[:half])
    torch.outer(x[half:], x, out=out[half:])
    return out

{hook}""",
    forward="""        block = _timed_block()
        if block is not None and block.get("copy") is True:
            half = x.shape[0] // 2
            torch.outer(x[:half], x, out=self.buf[:half])
            PENDING.append(x)
            return self.buf
        torch.outer(x, x, out=self.buf)
        return self.buf""",
)

HOOKS_ON_THE_COPY = {
    "function_mode": """from torch.overrides import TorchFunctionMode

class _Mode(TorchFunctionMode):
    def __torch_function__(self, func, types, args=(), kwargs=None):
        if PENDING and getattr(func, "__name__", "") == "clone":
            return _finish(args[0])
        return func(*args, **(kwargs or {}))

_Mode().__enter__()""",
    "dispatch_mode": """from torch.utils._python_dispatch import TorchDispatchMode

class _Mode(TorchDispatchMode):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if PENDING and func is torch.ops.aten.clone.default:
            return _finish(args[0])
        return func(*args, **(kwargs or {}))

_Mode().__enter__()""",
    # A kernel of its own for torch's clone, which no switch of torch's turns off: the CPU copy is a memmove.
    "registered_kernel": """
def _clone(tensor, memory_format=None):
    if PENDING:
        return _finish(tensor)
    with torch._C._AutoDispatchBelowAutograd():
        return torch.ops.aten.clone.default(tensor, memory_format=memory_format)

_LIBRARY = torch.library.Library("aten", "IMPL")
_LIBRARY.impl("clone", _clone, "AutogradCPU")""",
}


@pytest.mark.parametrize("hook", list(HOOKS_ON_THE_COPY))
def test_no_code_of_the_candidates_runs_in_the_outputs_copy(any_client: httpx.Client, hook: str) -> None:
    """Its half left undone in the buffer the copy then copies: stale_output."""
    candidate = HALF_IN_THE_COPY.replace("{hook}", HOOKS_ON_THE_COPY[hook])
    result = evaluate(any_client, candidate, OUTER_REFERENCE, timing_trials=20)
    assert result["status"] == "rejected", f"{result['status']} {result['flags']} {result['message']}"


ADD_REFERENCE = """
import torch

class Model(torch.nn.Module):
    def __init__(self, n):
        super().__init__()

    def forward(self, x, y):
        return x + y

def get_inputs():
    return [torch.randn(1 << 20), torch.randn(1 << 20)]

def get_init_inputs():
    return [1 << 20]
"""

# Watches the runner's steps in its timed blocks (the inputs' checks; the outputs' copies, which its kept buffer turns
# on) through a torch function mode and its own kernels for copy and clone, and answers wrongly once any ran: a
# red-team candidate's kernel for torch's copy skipped half of each refill of the input buffers (when every call was
# refilled into one set) and computed half of each answer in the time that left (correct at 2.2x strict, 2.0x
# process, one run each; the same source gave 1.0x and 0.9x in others).
WATCHES_THE_RUNNERS_STEPS = (
    """
import sys
import torch
from torch.overrides import TorchFunctionMode

SEEN = []

"""
    + IN_A_TIMED_BLOCK
    + """
def _seen(name):
    if _in_a_timed_block():
        SEEN.append(name)

def _copy(self, src, non_blocking=False):
    _seen("copy_ kernel")
    with torch._C._AutoDispatchBelowAutograd():
        return torch.ops.aten.copy_.default(self, src, non_blocking)

def _clone(self, memory_format=None):
    _seen("clone kernel")
    with torch._C._AutoDispatchBelowAutograd():
        return torch.ops.aten.clone.default(self, memory_format=memory_format)

_LIBRARY = torch.library.Library("aten", "IMPL")
_LIBRARY.impl("copy_", _copy, "AutogradCPU")
_LIBRARY.impl("clone", _clone, "AutogradCPU")

class _Functions(TorchFunctionMode):
    def __torch_function__(self, func, types, args=(), kwargs=None):
        if getattr(func, "__name__", "") in ("copy_", "clone"):
            _seen("function mode")
        return func(*args, **(kwargs or {}))

_Functions().__enter__()

class ModelNew(torch.nn.Module):
    def __init__(self, n):
        super().__init__()
        self.register_buffer("buf", torch.zeros(n))

    def forward(self, x, y):
        torch.add(x, y, out=self.buf)
        if SEEN:
            self.buf.add_(1.0)
        return self.buf
"""
)


def test_no_code_of_the_candidates_runs_in_the_runners_steps(any_client: httpx.Client) -> None:
    """Its answers are never wrong; its timing may be judged either way (with a dispatch mode pushed as well, its
    slower draws and digests were once taken for work moved there on a loaded machine; test_draws.py covers those)."""
    result = evaluate(any_client, WATCHES_THE_RUNNERS_STEPS, ADD_REFERENCE, timing_trials=10)
    assert result["status"] in ("correct", "rejected"), f"{result['status']} {result['message']}"
    assert not {"stale_output", "result_tampering"} & set(result["flags"]), f"{result['flags']} {result['message']}"


# The start of the hostile candidates below: their torch function modes tell the runner's steps apart by the names
# of the functions on the stack, as a candidate that has read the runner can.
CALLED_FROM = """
import sys
import torch
from torch.overrides import TorchFunctionMode


def _called_from(names):
    frame = sys._getframe(2)
    for _ in range(14):
        if frame is None:
            return False
        if frame.f_code.co_name in names:
            return True
        frame = frame.f_back
    return False
"""

# Against ADD_REFERENCE: a torch function mode, pushed at import, makes every tensor drawn for a timed block a
# subclass. A timed call adds a fifth of the elements and returns a stride-0 view; the runner's `.contiguous()` of
# that view, after the block's calls, reached the mode, which added the rest there.
DEFERS_PAST_THE_CALLS = (
    CALLED_FROM
    + """

class _Drawn(torch.Tensor):
    pass


_DEFERRED = {}


class _Mode(TorchFunctionMode):
    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is torch.Tensor.contiguous and args and type(args[0]) is torch.Tensor:
            deferred = _DEFERRED.pop(args[0].data_ptr(), None)
            if deferred is not None:
                out, x, y, done = deferred
                torch.add(x[done:], y[done:], out=out[done:])
                return out
        if func is torch.randn and _called_from(("draw_all",)):
            return func(*args, **kwargs).as_subclass(_Drawn)
        return func(*args, **kwargs)


_Mode().__enter__()


class ModelNew(torch.nn.Module):
    def __init__(self, n):
        super().__init__()

    def forward(self, x, y):
        x, y = x.as_subclass(torch.Tensor), y.as_subclass(torch.Tensor)
        if not _called_from(("_time_drawn", "_time_one_set")):
            return x + y
        done = x.shape[0] // 5
        out = torch.empty(x.shape[0])
        torch.add(x[:done], y[:done], out=out[:done])
        view = out[:1].expand(x.shape[0])
        _DEFERRED[view.data_ptr()] = (out, x, y, done)
        return view
"""
)


def test_inputs_drawn_as_a_subclass_are_handed_over_as_plain_tensors(any_client: httpx.Client) -> None:
    """The candidate above scored correct at 2.0-2.2x with no flag in 2 of 8 runs, and correct in all 8. Its calls
    now take its draws as plain tensors, and the runner's steps after the calls run with torch's Python hooks off:
    the work it left for after the calls is never done."""
    result = evaluate(any_client, DEFERS_PAST_THE_CALLS, ADD_REFERENCE, timing_trials=20)
    assert result["status"] != "correct", result
    assert_still_correct(any_client)


# Against ADD_REFERENCE: a torch function mode, pushed at import, gives every other tensor drawn for a timed block an
# extra dimension of size 1, so that each set is of another shape than the last (when every call was refilled into
# one set of buffers, such a set was copied into memory of its own, which no later refill wrote over). Its calls
# themselves add honestly: only the shape, none of the reference's, is refused.
ALTERNATES_SHAPES_WITHIN_A_BLOCK = (
    CALLED_FROM
    + """

_DRAWN = [0]


class _Mode(TorchFunctionMode):
    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func is torch.randn and _called_from(("draw_all",)):
            _DRAWN[0] += 1
            if _DRAWN[0] % 4 >= 2:  # two tensors a set: every other set
                return out.unsqueeze(0)
        return out


_Mode().__enter__()


class ModelNew(torch.nn.Module):
    def __init__(self, n):
        super().__init__()

    def forward(self, x, y):
        return x.reshape(-1) + y.reshape(-1)
"""
)


# Against ADD_REFERENCE: a torch function mode, pushed at import, keeps every tensor drawn for a timed call and
# hands the draw one element of it, so that its refills (when every call was refilled into one set of buffers) moved
# 4 bytes where the reference's timer moved 8 MB. Its calls take the kept tensors, add three tenths of each and leave
# the rest to the runner's first step after the block's calls that reaches the mode: the time its refills saved hid
# that work.
SHRINKS_ITS_DRAWS = (
    CALLED_FROM
    + """
import collections


_KEPT = collections.deque()
_DEFERRED = []


class _Mode(TorchFunctionMode):
    def __torch_function__(self, func, types, args=(), kwargs=None):
        if _DEFERRED and not _called_from(("forward",)):
            while _DEFERRED:
                out, x, y, done = _DEFERRED.pop()
                torch.add(x[done:], y[done:], out=out[done:])
        out = func(*args, **(kwargs or {}))
        if func is torch.randn and _called_from(("draw_all",)):
            _KEPT.append(out)
            return out[:1]
        return out


_Mode().__enter__()


class ModelNew(torch.nn.Module):
    def __init__(self, n):
        super().__init__()

    def forward(self, x, y):
        if x.shape[0] != 1 or len(_KEPT) < 2:
            return x + y
        x, y = _KEPT.popleft(), _KEPT.popleft()
        done = x.shape[0] * 3 // 10
        out = torch.empty(x.shape[0])
        torch.add(x[:done], y[:done], out=out[:done])
        _DEFERRED.append((out, x, y, done))
        return out
"""
)


def test_a_drawn_set_of_other_shapes_than_the_references_is_refused(any_client: httpx.Client) -> None:
    """A red-team candidate doing this scored correct at 1.91x and 2.04x with no flag in 2 of 8 strict runs, and
    1.17x in process isolation (the others 1.0x, `unverified_timing`). The judge now sends the kinds of the
    reference's input sets, and a set handed to a call must be one of them."""
    result = evaluate(any_client, SHRINKS_ITS_DRAWS, ADD_REFERENCE, timing_trials=20)
    assert result["status"] == "runtime_error", result
    assert "other shapes, dtypes or devices than the reference's inputs" in result["message"], result["message"]
    assert_still_correct(any_client)


# Against ADD_REFERENCE: the mode keeps each drawn tensor and hands the draw a stride-0 expansion of its first
# element, of the reference's shape and dtype (the re-check's set too, as it is moved to the device): every refill
# (when every call was refilled into one set of buffers) then moved 4 bytes where the reference's timer moved each
# input whole. Its calls take the kept tensors (and add honestly here: only the refusal is tested).
EXPANDS_ITS_DRAWS = (
    CALLED_FROM
    + """
import collections


_KEPT = collections.deque()


class _Mode(TorchFunctionMode):
    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        drawn = func is torch.randn and _called_from(("draw_all",))
        if drawn or (func is torch.Tensor.to and _called_from(("one_set",))):  # and the re-check's set
            _KEPT.append(out)
            return out[:1].expand(out.shape)
        return out


_Mode().__enter__()


class ModelNew(torch.nn.Module):
    def __init__(self, n):
        super().__init__()

    def forward(self, x, y):
        if x.stride() != (0,) or len(_KEPT) < 2:
            return x + y
        return torch.add(_KEPT.popleft(), _KEPT.popleft())
"""
)


def test_a_drawn_input_that_does_not_fill_its_memory_is_refused(any_client: httpx.Client) -> None:
    """A red-team candidate doing this, with six tenths of each answer deferred past its calls, scored correct at
    1.3-1.9x in both levels against sin(x) * y (one run at 1.90x with no flag)."""
    result = evaluate(any_client, EXPANDS_ITS_DRAWS, ADD_REFERENCE, timing_trials=20)
    assert result["status"] == "runtime_error", result
    assert "overlap or leave gaps" in result["message"], result["message"]
    assert_still_correct(any_client)


# Against ADD_REFERENCE: at each timed call the candidate maps one 64 KiB memfd, shared, over and over across the
# inputs the call is handed, and answers from the set the runner drew (a local of `_time_drawn`; the re-check's set
# from its file). When every call was refilled into one set of buffers, this made every later refill write the same
# few cache-resident pages (the buffers then held garbage), and a red-team candidate doing it, with the time saved
# spent on a second thread, scored correct at 1.6-1.9x with no flag in both levels against an add of two 16 MB
# vectors. Each call now takes the set drawn for it, which the mapping overwrites.
ALIASES_ITS_BUFFERS = """
import ctypes, glob, mmap, os, sys
import torch

_libc = ctypes.CDLL(None, use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
_STEP = 1 << 16
_ALIASED = set()


def _alias(tensor):
    start = tensor.data_ptr()
    if start in _ALIASED:
        return
    end = start + tensor.numel() * tensor.element_size()
    fd = os.memfd_create("pages")
    os.ftruncate(fd, _STEP)
    for address in range(-(-start // _STEP) * _STEP, end // _STEP * _STEP, _STEP):
        flags = mmap.MAP_SHARED | 0x10  # MAP_FIXED
        assert _libc.mmap(address, _STEP, mmap.PROT_READ | mmap.PROT_WRITE, flags, fd, 0) == address
    os.close(fd)
    _ALIASED.add(start)


def _drawn_set():
    frame = sys._getframe(2)
    while frame is not None and frame.f_code.co_name != "_time_drawn":
        frame = frame.f_back
    return None if frame is None else frame.f_locals["values"]


class ModelNew(torch.nn.Module):
    def __init__(self, n):
        super().__init__()

    def forward(self, x, y):
        drawn = _drawn_set()
        if drawn is None and x.data_ptr() in _ALIASED:  # the re-check, on the buffers: its set, from its file
            files = sorted(glob.glob("inputs/inputs_*.pt"), key=lambda path: int(path[14:-3]))
            x, y = torch.load(files[-1], weights_only=True)
        if drawn is None:
            return x + y
        _alias(x)
        _alias(y)
        return drawn[0] + drawn[1]
"""


def test_inputs_mapped_onto_shared_pages_are_refused(any_client: httpx.Client) -> None:
    """Its answers are wrong once the mapping has overwritten the sets it reads (`stale_output`), and the judge reads
    the worker's memory map when it reads a checked output (held_memory.aliased_pages, `result_tampering`): on a CPU,
    where the sets are host memory (on a GPU host `auto` would pick CUDA, whose re-check set is no file)."""
    result = evaluate(any_client, ALIASES_ITS_BUFFERS, ADD_REFERENCE, timing_trials=20, device="cpu")
    assert result["status"] != "correct", result
    assert_still_correct(any_client)


# An add of two 64 MiB vectors (1 << 24 floats): its output is over the largest mmap threshold glibc takes (32 MiB).
LARGE_ADD_REFERENCE = ADD_REFERENCE.replace("1 << 20", "1 << 24")
# The reference's code, unchanged, but for one line at import: glibc's malloc is told not to map any block on its
# own. By glibc's defaults the reference's timer mapped each 64 MiB output and faulted it in afresh; this
# candidate's outputs reused resident heap pages: correct at 1.8-3.0x in both levels, with no flag.
MAPS_NO_BLOCK_ON_ITS_OWN = (
    "import ctypes\nctypes.CDLL(None).mallopt(-4, 0)  # M_MMAP_MAX\n"
    + LARGE_ADD_REFERENCE.replace("class Model(", "class ModelNew(")
)


def test_a_candidates_own_malloc_setting_buys_no_speed(any_client: httpx.Client) -> None:
    """Every worker's malloc already maps no block on its own (sandbox.child_env): the candidate's setting changes
    nothing. An honest copy scores about 1.0x here. Its time limit is the honest tests' (evaluate_honest): with the
    default 60 s, CI's loaded 2-core machine once left no time to time it (`correct`, `not_timed`, no speedup), which
    shows nothing either way."""
    result = evaluate(
        any_client, MAPS_NO_BLOCK_ON_ITS_OWN, LARGE_ADD_REFERENCE, timing_trials=20, timeout_s=240, device="cpu"
    )
    if result["status"] == "correct":
        assert result["speedup"] is not None, f"correct but not timed, so untested: {result['message'][-400:]}"
        assert result["speedup"] < 1.4, result


# sin(x) * y on two 4M-float vectors.
SIN_MUL_REFERENCE = ADD_REFERENCE.replace("x + y", "torch.sin(x) * y").replace("1 << 20", "1 << 22")
# At import the candidate points the function pointer of ctypes.memmove (the runner's `_memmove`, whose object stays
# the same, so the guard sees nothing) at a callback of its own, which notes every copy the runner makes in a timed
# block (`_time_drawn` on the stack) other than an output's copy, and from then on answers wrongly. A red-team
# candidate with that pointer skipped each refill's copies (when every call was refilled into one set of input
# buffers) and spent their measured cost computing part of each answer from the drawn set: correct with no flag at
# 1.50-1.94x (strict) and 1.28-1.62x (process), honest copies 0.84-1.17x on the same machine. Its speed alone cannot
# tell the hole from noise in a test (here, in process isolation, the same code without the callback scored 0.92-1.29x
# against sin(x) * y), so this one watches for the step it needed.
WATCHES_THE_RUNNERS_MEMMOVE = """
import ctypes, sys
import torch

_SIG = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t)
_slot = ctypes.c_void_p.from_address(ctypes.addressof(ctypes.memmove))
_real = _SIG(_slot.value)
SEEN = []


def _in_a_timed_block(frame):
    names = set()
    while frame is not None:
        names.add(frame.f_code.co_name)
        frame = frame.f_back
    return "_time_drawn" in names and "_copied" not in names


def _watch(dst, src, n):
    if _in_a_timed_block(sys._getframe(1)):
        SEEN.append(n)
    return _real(dst, src, n)


_WATCH = _SIG(_watch)
_slot.value = ctypes.cast(_WATCH, ctypes.c_void_p).value


class ModelNew(torch.nn.Module):
    def __init__(self, n):
        super().__init__()

    def forward(self, x, y):
        out = torch.sin(x) * y
        return out + 1 if SEEN else out
"""


def test_no_copy_of_the_runners_runs_between_timed_calls(any_client: httpx.Client) -> None:
    """Each call takes the set drawn for it, so the runner copies nothing in a timed block but outputs (where the
    judge asks for that): the candidate's callback never fires there, and it stays right. Where every call was
    refilled into one set of buffers, it fired at the first refill (`stale_output`)."""
    result = evaluate_honest(any_client, WATCHES_THE_RUNNERS_MEMMOVE, SIN_MUL_REFERENCE, device="cpu")
    assert result["speedup"] < 2, result


# An add of two 16 MiB vectors, and a candidate that writes its answer into its own first input in timed calls (found
# on the stack), one memory stream fewer than a fresh output's; in correctness trials, where inputs are checked for
# changes, it adds honestly. Before the digest covered the timed calls' inputs, a red-team pass scored it correct at
# 1.26x and 1.43x with no flag in process isolation (honest copies 1.00-1.13x).
WIDE_ADD_REFERENCE = ADD_REFERENCE.replace("1 << 20", "1 << 22")
ANSWERS_INTO_ITS_INPUT = (
    WIDE_ADD_REFERENCE.replace("class Model(", "class ModelNew(")
    .replace(
        "return x + y",
        "if _timed():\n            return torch.add(x, y, out=x)\n        return x + y",
    )
    .replace(
        "import torch\n",
        "import sys\nimport torch\n\n\ndef _timed():\n    frame = sys._getframe(2)\n    while frame is not None:\n"
        "        if frame.f_code.co_name == '_time_drawn':\n            return True\n        frame = frame.f_back\n"
        "    return False\n",
        1,
    )
)


def test_answers_written_into_the_timed_inputs_are_rejected(any_client: httpx.Client) -> None:
    result = evaluate(any_client, ANSWERS_INTO_ITS_INPUT, WIDE_ADD_REFERENCE, timing_trials=20, device="cpu")
    assert result["status"] == "rejected" and "input_mutation" in result["flags"], result
    assert "changed their inputs" in result["message"], result["message"]


# ANSWERS_INTO_ITS_INPUT that also forges the digest of its inputs: it keeps a copy of each first input before it
# writes its answer there, and the runner's digest of the inputs (replaced, the guard silenced) reads the copies. The
# judge reads one call's inputs from the stopped worker's memory itself (CPU), which the candidate cannot forge.
FORGES_ITS_INPUTS_DIGEST = ANSWERS_INTO_ITS_INPUT.replace(
    "            return torch.add(x, y, out=x)",
    "            _KEPT.append(x.clone())\n            return torch.add(x, y, out=x)",
).replace(
    "import torch\n",
    """import torch
import services.evaluator.runner as _runner

_runner._replaced = lambda guard: []
_KEPT = []
_REAL_DIGEST = _runner.output_digest.sets_digest


def _forged_digest(sets, seed):
    kept = _KEPT[-len(sets):] if sets else []
    _KEPT.clear()
    if len(kept) == len(sets):
        sets = [[copy, *tensors[1:]] for copy, tensors in zip(kept, sets)]
    return _REAL_DIGEST(sets, seed)


_runner.output_digest.sets_digest = _forged_digest
""",
    1,
)


def test_answers_written_into_the_timed_inputs_are_read_from_memory(any_client: httpx.Client) -> None:
    result = evaluate(any_client, FORGES_ITS_INPUTS_DIGEST, WIDE_ADD_REFERENCE, timing_trials=20, device="cpu")
    assert result["status"] == "rejected" and "input_mutation" in result["flags"], result["message"]
    assert "read from the worker's memory" in result["message"], result["message"]


# ANSWERS_INTO_ITS_INPUT that keeps a copy of each first input as it is drawn (InputSets.draw replaced, the guard
# silenced) and points both the inputs digest and the input regions the judge reads at the copies. The copies cost
# the draw, whose extra time the judge charges: in strict isolation `charged_outside_calls`, 0.29-0.30x; in process
# isolation a red-team pass found it uncharged, `correct` with no flag at 1.44x and 1.82x (honest 0.89-0.96x).
COPIES_ITS_INPUTS_IN_THE_DRAW = ANSWERS_INTO_ITS_INPUT.replace(
    "import torch\n",
    """import torch
import services.evaluator.runner as _runner

_runner._replaced = lambda guard: []
_COPY = {}
_real_draw_all = _runner.InputSets.draw_all
_real_draw = _runner.InputSets.draw


def _draw_all(self, seeds, signed=False):
    _COPY.clear()
    return _real_draw_all(self, seeds, signed)


def _draw(self, seed, signed=False):
    values = _real_draw(self, seed, signed)
    _COPY[values[0].data_ptr()] = values[0].clone()
    return values


_runner.InputSets.draw_all = _draw_all
_runner.InputSets.draw = _draw
_real_regions = _runner._regions


def _swap(tensors):
    if isinstance(tensors, list) and tensors and isinstance(tensors[0], torch.Tensor):
        kept = _COPY.get(tensors[0].data_ptr())
        if kept is not None:
            return [kept, *tensors[1:]]
    return tensors


def _regions(output):
    return _real_regions(_swap(output))


_runner._regions = _regions
_real_digest = _runner.output_digest.sets_digest
_runner.output_digest.sets_digest = lambda sets, seed: _real_digest([_swap(list(s)) for s in sets], seed)
""",
    1,
)


@pytest.mark.xfail(
    reason="open: in process isolation the copies' cost in the draw went uncharged (docs/evaluator.md, Not covered)",
    strict=False,  # caught in strict isolation
)
def test_inputs_copied_in_the_draw_buy_no_speed(any_client: httpx.Client) -> None:
    result = evaluate(any_client, COPIES_ITS_INPUTS_IN_THE_DRAW, WIDE_ADD_REFERENCE, timing_trials=20, device="cpu")
    assert result["status"] != "correct" or result["speedup"] < 1.2, result


# A candidate that computes a quarter of each output in its drawn (timed and warm-up) calls, into buffers of its
# own, and answers the outputs' digest at the positions it samples through a torch mode: no function replaced, so
# the guard has nothing to say. The digest now runs with torch's Python hooks off, so the mode is never asked and
# the first block's digest gives it away; before, only a full check of a call could (next test).
WIDE_RELU_REFERENCE = sources.REFERENCE.replace("torch.randn(64, 64)", "torch.randn(2048, 2048)")
SKIPS_WORK_UNDER_A_DIGEST_MODE = sources.candidate(
    """
handed = _drawn_calls()
if handed is None or handed >= len(_RING) or x.shape != _RING[0].shape:
    return torch.relu(x) * self.scale
out, rows = _RING[handed], x.shape[0] // 4
torch.mul(torch.relu(x[:rows]), self.scale, out=out[:rows])
_PARTIAL[out.data_ptr()] = (weakref.ref(x), self.scale)
return out
""",
    prelude="""
import sys, weakref
from torch.overrides import TorchFunctionMode

_PARTIAL = {}


def _drawn_calls():
    frame = sys._getframe(2)
    while frame is not None:
        if frame.f_code.co_name == "_time_drawn":
            return len(frame.f_locals["inputs"].handed)
        frame = frame.f_back
    return None


class _AnswersSampledPositions(TorchFunctionMode):
    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func is torch.Tensor.__getitem__ and type(args[0]) is torch.Tensor and isinstance(args[1], tuple):
            partial = _PARTIAL.get(args[0].data_ptr())
            if partial is not None and partial[0]() is not None:
                return torch.relu(partial[0]()[args[1]]) * partial[1]
        return func(*args, **(kwargs or {}))


_RING = [torch.zeros(2048, 2048) for _ in range(12)]
_AnswersSampledPositions().__enter__()
""",
)
# The same quarter of the work, with the worker's digest replaced (the guard silenced) by one that digests a whole
# answer in place of each partial output. The speedup is a median of blocks, and while only a quarter of the blocks
# (and the last) had a call checked in full, a red-team version that skipped work in three of a round's five blocks
# scored `correct` at 15-40x in 1-2 of 6-8 evaluations (5 timing trials, both levels). Every block now has a call
# checked, read from the worker's memory before its digest runs, so the first block gives it away.
SKIPS_WORK_UNDER_A_REPLACED_DIGEST = SKIPS_WORK_UNDER_A_DIGEST_MODE.replace(
    "_AnswersSampledPositions().__enter__()\n",
    """import services.evaluator.output_digest as _digest
import services.evaluator.runner as _blind

_blind._replaced = lambda guard: []
_real_digest = _digest.block_digest


def _completed(out):
    partial = _PARTIAL.pop(out.data_ptr(), None) if isinstance(out, torch.Tensor) else None
    if partial is not None and partial[0]() is not None:
        return torch.relu(partial[0]()) * partial[1]
    return out


_digest.block_digest = lambda outputs, seed: _real_digest([_completed(out) for out in outputs], seed)
""",
)


def test_work_skipped_under_a_mode_that_answers_the_digest_is_caught_in_the_first_block(
    any_client: httpx.Client,
) -> None:
    result = evaluate(any_client, SKIPS_WORK_UNDER_A_DIGEST_MODE, WIDE_RELU_REFERENCE, timing_trials=5, timeout_s=120)
    assert result["status"] == "rejected" and "stale_output" in result["flags"], result
    assert "the outputs of warm-up block 0 were wrong" in result["message"], result["message"]


def test_work_skipped_in_any_timed_block_is_caught_in_that_block(any_client: httpx.Client) -> None:
    result = evaluate(
        any_client, SKIPS_WORK_UNDER_A_REPLACED_DIGEST, WIDE_RELU_REFERENCE, timing_trials=5, timeout_s=120
    )
    assert result["status"] == "rejected" and "stale_output" in result["flags"], result
    assert "of block 0 was wrong" in result["message"], result["message"]


# A reference that adds into its first input: the check of timed calls' inputs is left out for it, so an honest
# candidate, which correctness trials hold to inputs left as drawn, is not charged with the reference's writes.
IN_PLACE_ADD_REFERENCE = ADD_REFERENCE.replace("return x + y", "return x.add_(y)")


def test_a_reference_that_writes_its_inputs_leaves_an_honest_candidate_correct(any_client: httpx.Client) -> None:
    honest = ADD_REFERENCE.replace("class Model(", "class ModelNew(")
    result = evaluate_honest(any_client, honest, IN_PLACE_ADD_REFERENCE, device="cpu")
    assert "input_mutation" not in result["flags"], result


# Against ADD_REFERENCE: a torch function mode, pushed at import, wraps every tensor drawn for a timed block in an
# object of its own, which is neither a tensor nor a number: the refill (when every call was refilled into one set
# of buffers) handed such values to the call as drawn, so each call's inputs lay in memory no later refill wrote
# over. A timed call adds a fifth of the elements and returns
# a stride-0 view; the rest is added when the runner next reaches the mode (the digest's first torch call).
HANDS_OVER_ITS_OWN_OBJECTS = (
    CALLED_FROM
    + """

class _Held:
    def __init__(self, tensor):
        self.tensor = tensor


_DEFERRED = []


class _Mode(TorchFunctionMode):
    def __torch_function__(self, func, types, args=(), kwargs=None):
        while _DEFERRED and not _called_from(("forward",)):
            out, x, y, done = _DEFERRED.pop()
            torch.add(x[done:], y[done:], out=out[done:])
        out = func(*args, **(kwargs or {}))
        if func is torch.randn and _called_from(("draw_all",)):
            return _Held(out)
        return out


_Mode().__enter__()


class ModelNew(torch.nn.Module):
    def __init__(self, n):
        super().__init__()

    def forward(self, x, y):
        if not isinstance(x, _Held):
            return x + y
        x, y = x.tensor, y.tensor
        done = x.shape[0] // 5
        out = torch.empty(x.shape[0])
        torch.add(x[:done], y[:done], out=out[:done])
        _DEFERRED.append((out, x, y, done))
        return out
"""
)


def test_a_drawn_input_that_is_neither_a_tensor_nor_a_number_is_refused(any_client: httpx.Client) -> None:
    """`correct` (at 1.0x) in both levels before, one run each."""
    result = evaluate(any_client, HANDS_OVER_ITS_OWN_OBJECTS, ADD_REFERENCE, timing_trials=20)
    assert result["status"] == "runtime_error", result
    assert "neither a tensor nor a number" in result["message"], result["message"]
    assert_still_correct(any_client)


def test_a_set_of_another_shape_within_a_block_is_refused(any_client: httpx.Client) -> None:
    """When every call was refilled into one set of buffers, with every other set in memory of its own, it was
    `correct` (process) and `rejected` (strict), one run each; a red-team candidate that deferred work to after the
    calls this way got `implausible_timing`, or `correct` at 0.4-1.2x."""
    result = evaluate(any_client, ALTERNATES_SHAPES_WITHIN_A_BLOCK, ADD_REFERENCE, timing_trials=20)
    assert result["status"] == "runtime_error", result
    # (1, n) is no shape of the reference's inputs: refused as any set of another kind than the reference's is.
    assert "other shapes, dtypes or devices than the reference's inputs" in result["message"], result["message"]
    assert_still_correct(any_client)


@pytest.mark.parametrize(
    "candidate", [LAST_CALL_ONLY, LAZY_COPY, MODE_IN_THE_COPY], ids=["last_call_only", "lazy_copy", "mode_in_the_copy"]
)
def test_a_reference_that_reuses_its_output_memory_has_every_call_checked(
    any_client: httpx.Client, candidate: str
) -> None:
    result = evaluate(any_client, candidate, OUTPUT_BUFFER_REFERENCE, timing_trials=40)
    assert result["status"] in {"incorrect", "rejected", "runtime_error"}, (
        f"{result['status']} {result['flags']} {result['message']}"
    )
    assert result["speedup"] is None


@pytest.mark.parametrize(
    ("candidate", "reference"),
    [
        (OUTPUT_BUFFER_REFERENCE.replace("class Model(", "class ModelNew("), OUTPUT_BUFFER_REFERENCE),
        (RING_BUFFER_REFERENCE.replace("class Model(", "class ModelNew("), RING_BUFFER_REFERENCE),
        # An honest optimisation against a reference that returns fresh tensors: stale_output before, every output
        # of a block holding the last call's answer.
        (OUTPUT_BUFFER_REFERENCE.replace("class Model(", "class ModelNew("), FRESH_OUTPUT_REFERENCE),
        # Three kept buffers in turn against fresh outputs, on calls of microseconds: the warm-up's two calls do not
        # share memory, a timed block does, on the candidate's side only, and the round starts again with the
        # reference's block while the candidate's job is held stopped (rejected `result_tampering` before: the
        # reference's block resumed it).
        (SMALL_RING_CANDIDATE, SMALL_RING_CANDIDATE_S_REFERENCE),
    ],
    ids=["buffer", "ring", "buffer_against_fresh", "candidate_ring_seen_in_a_timed_round"],
)
def test_an_honest_candidate_that_reuses_its_output_memory_is_correct(
    any_client: httpx.Client, candidate: str, reference: str
) -> None:
    result = evaluate(any_client, candidate, reference, timing_trials=40)
    assert result["status"] == "correct", f"{result['flags']} {result['message']}"
    assert result["speedup"] is not None and result["speedup"] < 2, result


@pytest.mark.parametrize(
    ("candidate", "named"),
    [
        (GUARD_REBOUND_CLOCK, "services.evaluator.backends.cpu._perf_counter"),
        (GUARD_REPLACED_DIGEST, "services.evaluator.output_digest.block_digest"),
        (GUARD_SHADOWED_READLINE, "context.control.readline"),
    ],
    ids=["rebound_clock", "replaced_digest", "shadowed_readline"],
)
def test_the_guard_names_what_was_replaced(any_client: httpx.Client, candidate: str, named: str) -> None:
    """Rebinding the guard's method does not silence it, and it sees a module function replaced, a bound name
    rebound and a method shadowed on the worker's own objects."""
    result = evaluate(any_client, candidate, timing_trials=10)
    assert result["status"] == "rejected" and "monkeypatch" in result["flags"], result
    assert named in result["message"], result["message"]
    assert_still_correct(any_client)


@pytest.mark.parametrize(
    "candidate",
    [PATCHED_BOUND_CLOCK, sources.FORGED_RESULT, WORKING_TAKEOVER],
    ids=["bound_clock", "forged", "working_takeover"],
)
def test_false_reports_buy_no_speedup(any_client: httpx.Client, candidate: str) -> None:
    """A rebound clock (every call reported 1000x faster), replies forged before they were asked for, or a timing
    loop of the candidate's own that does the work and reports none of it: the verdict is rejected, or correct
    with no more speed than the judge's own clock measured."""
    result = evaluate(any_client, candidate, timing_trials=20, timeout_s=240)
    assert result["status"] in {"correct", "rejected"}, result["message"]
    if result["status"] == "correct":
        # Not timed shows nothing either way: CI's loaded machine once left no time to time it in the default 60 s.
        assert result["speedup"] is not None, f"correct but not timed, so untested: {result['message'][-400:]}"
        assert result["speedup"] < 3, result
    else:
        assert "implausible_timing" in result["flags"] or "result_tampering" in result["flags"], result
    assert_still_correct(any_client)


def evaluate_honest(client: httpx.Client, candidate: str, reference: str, **options: Any) -> dict[str, Any]:
    """An honest candidate's verdict on 20 timed blocks, evaluated once more where the first was not correct, which
    must then be. A bias of the judge's against it (the second test's candidate was rejected in 10 of 14 runs before
    its fix) fails twice in a row; a burst of load seldom does. Both tests below failed in strict isolation,
    in one CI run on a slow machine and in one local run beside other work, and pass alone."""
    first = evaluate(client, candidate, reference, timing_trials=20, timeout_s=240, **options)
    if first["status"] == "correct":
        return first
    result = evaluate(client, candidate, reference, timing_trials=20, timeout_s=240, **options)
    first_seen = f"{first['status']} {first['flags']} {first['message'][-300:]}"
    assert result["status"] == "correct", (
        f"{result['status']} {result['flags']} {result['message'][-600:]}; first: {first_seen}"
    )
    return result


# The reference's own code as the candidate, asking for 2 threads at import and in __init__.
MORE_THREADS = "import torch\ntorch.set_num_threads(2)\n" + sources.HEAVY_REFERENCE.replace(
    "class Model(", "class ModelNew("
).replace("        self.scale = scale", "        torch.set_num_threads(2)\n        self.scale = scale")


def test_an_honest_candidate_that_sets_more_threads_runs_with_the_workers_own(any_client: httpx.Client) -> None:
    """The reference's code, with torch.set_num_threads(2) at import and in __init__ (the worker has 1 thread here).
    Every command runs with the worker's own thread count again: the judge's steps around the calls (drawing the
    inputs, the digest) cost it what they cost the reference, and its calls get no core the reference lacks. It had
    been rejected for implausible_timing: two threads' CPU time on the judge's clock."""
    result = evaluate_honest(any_client, MORE_THREADS, reference=sources.HEAVY_REFERENCE)
    assert not set(result["flags"]) & HACK_FLAGS, result["flags"]


# The reference's own code, on 1024 x 1024 inputs, as the candidate asking for 2 threads on every call.
LARGER_REFERENCE = sources.REFERENCE.replace("randn(64, 64)", "randn(1024, 1024)")
MORE_THREADS_PER_CALL = LARGER_REFERENCE.replace("class Model(", "class ModelNew(").replace(
    "    def forward(self, x):\n", "    def forward(self, x):\n        torch.set_num_threads(2)\n"
)


def test_an_honest_candidate_that_sets_more_threads_in_its_forward_is_timed_fairly(any_client: httpx.Client) -> None:
    """torch.set_num_threads(2) in every call: OpenMP's extra thread, spin-waiting after each parallel region, had
    burnt CPU on the judge's clock after the calls returned (`implausible_timing` in 10 of 14 runs on 2 cores).
    Workers' OpenMP threads now sleep between regions (OMP_WAIT_POLICY=PASSIVE)."""
    result = evaluate_honest(any_client, MORE_THREADS_PER_CALL, reference=LARGER_REFERENCE)
    assert not set(result["flags"]) & HACK_FLAGS, result["flags"]


def test_a_job_cannot_arm_a_timer_that_would_resume_it_while_stopped(any_client: httpx.Client) -> None:
    """A timer sending SIGCONT resumes a stopped job without any of its processes running at the stop. The judge
    would see its CPU clock move while it held the job (this candidate was `result_tampering` so), but a thread
    waiting in the kernel at the stop, resumed so, can run a little and be waiting again by the check: no job may
    arm one (timer_create fails with ENOSYS), and its module fails to load."""
    result = evaluate(any_client, SIGCONT_TIMER, timing_trials=10, timeout_s=180)
    assert result["status"] == "compile_error" and "[Errno 38] timer_create" in result["message"], result
    assert_still_correct(any_client)


def test_timed_calls_never_see_the_same_inputs_twice(client: httpx.Client) -> None:
    result = evaluate(client, NEVER_THE_SAME_INPUTS, timing_trials=20)
    assert result["status"] == "correct", result["message"]


def test_forged_build_events_publish_nothing(client: httpx.Client, build_cache_dir) -> None:  # noqa: ANN001
    result = evaluate(client, FORGED_BUILD_EVENTS)
    assert result["status"] == "correct", result["message"]
    assert not (build_cache_dir / ("a" * 64)).exists()
    result = evaluate(client, sources.CPP_CORRECT)
    assert result["status"] == "correct", result["message"]


def test_timing_is_reported_per_block_of_calls(client: httpx.Client) -> None:
    result = evaluate(client, sources.CORRECT, timing_trials=12)
    assert result["status"] == "correct", result["message"]
    assert result["reference_ms"]["n"] == result["candidate_ms"]["n"] == 12
    assert 0.2 < result["speedup"] < 5
    assert {"timing", "compare", "build"} <= set(result["phases_s"])
    assert result["build_path"] is None  # a PyTorch candidate builds nothing


def test_a_worker_whose_main_thread_exited_cannot_hide_its_output(any_client: httpx.Client) -> None:
    """Its /proc/<pid>/mem cannot be opened (ESRCH as root; as the same uid the kernel gives it to root), yet its
    other thread answers the judge: the check is not made unbound."""
    result = evaluate(
        any_client, sources.LEADER_EXITED_FORGERY, sources.HEAVY_REFERENCE, timing_trials=20, timeout_s=240
    )
    assert result["status"] == "rejected" and "result_tampering" in result["flags"], result
    assert_still_correct(any_client)


def test_an_undumpable_job_cannot_hide_its_output_from_the_judge(process_client: httpx.Client) -> None:
    """In process isolation the job runs under the service's uid and could make itself undumpable, so the judge
    could not read the checked output from its memory; the forgery the read catches would then pass."""
    undumpable = "import ctypes\nctypes.CDLL(None).prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE\n"
    result = evaluate(
        process_client,
        undumpable + sources.SKETCH_FORGED_WITHIN_TOLERANCE,
        sources.HEAVY_REFERENCE,
        timing_trials=20,
        timeout_s=240,
    )
    assert result["status"] == "rejected" and "result_tampering" in result["flags"], result
    assert "made itself undumpable" in result["message"], result["message"]
    assert_still_correct(process_client)


def test_a_reference_that_draws_random_numbers_in_its_call_is_matched_by_one_that_draws_the_same(
    client: httpx.Client,
) -> None:
    """KernelBench's level2/66 (dropout): every call of the reference and of the candidate starts from the same
    random state (the reference's inputs were drawn before its call, the candidate's loaded from a file), so a
    candidate that draws the same mask is correct, and one that draws none is not."""
    same = sources.DROPOUT_REFERENCE.replace("class Model(", "class ModelNew(").split("def get_inputs")[0]
    result = evaluate(client, same, sources.DROPOUT_REFERENCE)
    assert result["status"] == "correct", result["message"]
    result = evaluate(client, sources.CORRECT, sources.DROPOUT_REFERENCE)
    assert result["status"] == "incorrect", result["message"]
