"""Engines for a sweep: the `local` and `kubernetes` launchers, and the providers that turn a
launcher (or the embedded engine's virtual clock) into an `EngineDriver` per chunk size.

`LocalLauncher` runs the engine from a command template in its own process session, with its log
under `results/{chunk}/engine/engine.log` (exposed as `EngineHandle.iteration_log`, so chunk
sizes come from vLLM's `--enable-logging-iteration-details` lines) and a state file beside it
(`engine.json`: pid, command, url, chunk size). A later invocation *adopts* a live engine that
file describes when it has the chunk size wanted (same process and command line, /health answers,
no logged step larger than the chunk), so a sweep stopped by a time limit and rerun does not pay
vLLM's ~100 s start again; an engine of another chunk size it stops. Stopping is SIGTERM to the
process group, then SIGKILL after `stop_timeout_s`.

`KubernetesLauncher` changes the chunk size of a deployed engine with `helm upgrade
--reuse-values --set KEY=CHUNK --wait`, or by patching a Deployment's container args with
`kubectl patch` and waiting for `kubectl rollout status`; then it waits for /health.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import json
import os
import platform
import shlex
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from pdexporter._internal.atomic import atomic_write_json
from pdexporter.engine.client import EngineClient
from pdexporter.engine.iterlog import parse_iteration_lines
from pdexporter.engine.launcher import EngineHandle, ExternalLauncher, Launcher, SimLauncher
from pdexporter.errors import ConfigError, EngineError, EngineTimeout
from pdexporter.measure.driver import EngineDriver, http_driver
from pdexporter.measure.store import ResultsStore
from pdexporter.sweep.spec import (
    ExternalLauncherSpec,
    KubernetesLauncherSpec,
    LocalLauncherSpec,
    SimLauncherSpec,
    SweepSpec,
)

STATE_FILE = "engine.json"
LOG_FILE = "engine.log"


class DeadlineReached(Exception):
    """Raised between runs when the next one would not finish before `--deadline`."""


# ---------------------------------------------------------------------------------------------
# Command templates (pure)


@dataclass(frozen=True)
class RenderedCommand:
    argv: tuple[str, ...]
    env: dict[str, str]

    @property
    def text(self) -> str:
        assigns = [f"{k}={shlex.quote(v)}" for k, v in self.env.items()]
        return " ".join([*assigns, *(shlex.quote(a) for a in self.argv)])


def render_command(template: str, chunk_size: int, variables: dict[str, str] | None = None,
                   env: dict[str, str] | None = None) -> RenderedCommand:
    """Fill {chunk}, {python} and `variables` in; leading `NAME=value` words become environment."""
    values = {"python": sys.executable, **(variables or {}), "chunk": str(chunk_size)}
    try:
        text = template.format_map(values)
    except KeyError as exc:
        raise ConfigError(
            f"launcher.command: unknown placeholder {{{exc.args[0]}}}; define it under launcher.vars"
        ) from None
    except (ValueError, IndexError) as exc:
        raise ConfigError(f"launcher.command: bad template ({exc})") from None
    try:
        words = shlex.split(text)
    except ValueError as exc:
        raise ConfigError(f"launcher.command: cannot split into words ({exc})") from None
    assigns: dict[str, str] = dict(env or {})
    while words and "=" in words[0] and words[0].split("=", 1)[0].isidentifier():
        name, value = words.pop(0).split("=", 1)
        assigns[name] = value
    if not words:
        raise ConfigError("launcher.command: no program to run")
    return RenderedCommand(tuple(words), assigns)


# ---------------------------------------------------------------------------------------------
# Local process launcher


@dataclass(frozen=True)
class EngineState:
    pid: int
    argv: tuple[str, ...]
    url: str
    chunk_size: int
    log: str
    host: str
    started_at: str
    proc_start: int | None  # the process's start time in clock ticks since boot (/proc/PID/stat)

    def to_json(self) -> dict[str, Any]:
        return {
            "pid": self.pid, "argv": list(self.argv), "url": self.url, "chunk_size": self.chunk_size,
            "log": self.log, "host": self.host, "started_at": self.started_at, "proc_start": self.proc_start,
        }

    @classmethod
    def read(cls, path: Path) -> EngineState | None:
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
            start = data.get("proc_start")
            return cls(int(data["pid"]), tuple(data["argv"]), str(data["url"]), int(data["chunk_size"]),
                       str(data["log"]), str(data["host"]), str(data["started_at"]),
                       None if start is None else int(start))
        except (OSError, ValueError, KeyError, TypeError):
            return None


def process_start_ticks(pid: int) -> int | None:
    """Field 22 of /proc/PID/stat: with the pid, it names one process (pids get reused; this
    does not change when a process renames itself, as some engines' workers do)."""
    try:
        rest = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return int(rest[19])
    except (OSError, IndexError, ValueError):
        return None


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie (exited, not reaped) still answers kill(0); /proc says which it is.
    try:
        status = Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1][:1]
        return status != "Z"
    except (OSError, IndexError):
        return True


def state_is_live(state: EngineState) -> bool:
    """The process the state file recorded is still running (same pid, same start time)."""
    if state.host != platform.node() or not pid_alive(state.pid):
        return False
    start = process_start_ticks(state.pid)
    return start is None or state.proc_start is None or start == state.proc_start


def log_contradicts_chunk(log: Path, chunk_size: int, tail_bytes: int = 4 << 20) -> bool:
    """True if the engine's own step log shows a step larger than the chunk size."""
    try:
        with log.open("rb") as handle:
            handle.seek(max(0, log.stat().st_size - tail_bytes))
            text = handle.read().decode("utf-8", "replace")
    except OSError:
        return False
    steps = parse_iteration_lines(text.splitlines())
    return any(s.context_tokens + s.generation_tokens > chunk_size for s in steps)


@dataclass
class LocalLauncher:
    command: str
    store: ResultsStore
    url: str = "http://127.0.0.1:8000"
    variables: dict[str, str] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)
    cwd: str | None = None
    health_timeout_s: float = 600.0
    stop_timeout_s: float = 60.0
    adopt: bool = True
    health_poll_s: float = 0.5
    kind: str = "vllm"
    gpu: str | None = None
    deadline: Callable[[], float | None] = lambda: None  # seconds left, or None
    on_message: Callable[[str], None] = lambda text: None
    name: str = "local"
    adopted: bool = field(default=False, init=False)
    _proc: subprocess.Popen[bytes] | None = field(default=None, init=False, repr=False)
    _state: EngineState | None = field(default=None, init=False, repr=False)
    _handle: EngineHandle | None = field(default=None, init=False, repr=False)

    @property
    def can_set_chunk_size(self) -> bool:
        return True

    def state_path(self, chunk_size: int) -> Path:
        return self.store.engine_dir(chunk_size) / STATE_FILE

    def log_path(self, chunk_size: int) -> Path:
        return self.store.engine_dir(chunk_size) / LOG_FILE

    def _known_states(self) -> list[tuple[Path, EngineState]]:
        out = []
        if self.store.root.is_dir():
            for path in sorted(self.store.root.glob(f"*/engine/{STATE_FILE}")):
                state = EngineState.read(path)
                if state is not None:
                    out.append((path, state))
        return out

    async def start(self, chunk_size: int) -> EngineHandle:
        if self._handle is not None and self._handle.chunk_size == chunk_size and self._alive():
            return self._handle
        await self._launch(chunk_size)
        return await self._ready(chunk_size)

    async def prestart(self, chunk_size: int) -> None:
        """Have the engine for this chunk size starting, without waiting for it: a sweep that
        has no time left to wait starts the next engine and exits; the next invocation adopts it."""
        await self._launch(chunk_size)
        self.release()

    def can_adopt(self, chunk_size: int) -> bool:
        """Whether `start(chunk_size)` would adopt a live engine instead of starting one."""
        if not self.adopt:
            return False
        wanted = render_command(self.command, chunk_size, self.variables, self.env)
        return any(
            state_is_live(state) and state.chunk_size == chunk_size and state.argv == wanted.argv
            and not log_contradicts_chunk(Path(state.log), chunk_size)
            for _, state in self._known_states()
        )

    async def _launch(self, chunk_size: int) -> None:
        """Adopt a live engine of this chunk size, or stop others and start one (state file first)."""
        await self.stop()
        # Engines this results directory started earlier: adopt the one we want, stop the others
        # (they hold the GPU and the port).
        for path, state in self._known_states():
            if not state_is_live(state):
                path.unlink(missing_ok=True)
                continue
            wanted = render_command(self.command, chunk_size, self.variables, self.env)
            if self.adopt and state.chunk_size == chunk_size and state.argv == wanted.argv:
                if log_contradicts_chunk(Path(state.log), chunk_size):
                    self.on_message(f"engine pid {state.pid}: its log shows steps above {chunk_size} tokens; restarting")
                else:
                    self.on_message(f"adopting the engine started earlier (pid {state.pid}, chunk {chunk_size})")
                    self._state = state
                    self.adopted = True
                    return
            self.on_message(f"stopping engine pid {state.pid} (chunk {state.chunk_size})")
            await _terminate_group(state.pid, self.stop_timeout_s)
            path.unlink(missing_ok=True)
        if await _answers_health(self.url):
            raise EngineError(
                f"{self.url} already answers /health but this sweep did not start it (no live "
                f"{STATE_FILE} under {self.store.root}): stop that engine, or use the external launcher"
            )
        rendered = render_command(self.command, chunk_size, self.variables, self.env)
        log = self.log_path(chunk_size)
        log.parent.mkdir(parents=True, exist_ok=True)
        with log.open("ab") as out:
            out.write(f"\n# pdexporter sweep: starting {rendered.text}\n".encode())
            out.flush()
            try:
                # Unbuffered, so the iteration lines are in the log by the time a window is read.
                self._proc = subprocess.Popen(
                    list(rendered.argv), stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                    env={**os.environ, "PYTHONUNBUFFERED": "1", **rendered.env}, cwd=self.cwd,
                    start_new_session=True,
                )
            except OSError as exc:
                raise ConfigError(f"launcher.command: cannot run {rendered.argv[0]!r} ({exc.strerror or exc})") from None
        self._state = EngineState(
            pid=self._proc.pid, argv=rendered.argv, url=self.url, chunk_size=chunk_size, log=str(log),
            host=platform.node(), started_at=dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
            proc_start=process_start_ticks(self._proc.pid),
        )
        atomic_write_json(self.state_path(chunk_size), self._state.to_json())
        self.adopted = False

    def _alive(self) -> bool:
        if self._proc is not None:
            return self._proc.poll() is None
        return self._state is not None and pid_alive(self._state.pid)

    async def _ready(self, chunk_size: int) -> EngineHandle:
        assert self._state is not None
        log = Path(self._state.log)
        deadline = time.monotonic() + self.health_timeout_s
        async with EngineClient(self.url) as client:
            while True:
                if not self._alive():
                    tail = _log_tail(log)
                    self._forget(chunk_size)
                    raise EngineError(f"engine exited during start-up (log {log}): {tail}")
                if await client.health():
                    break
                if time.monotonic() > deadline:
                    await self.stop()
                    raise EngineTimeout(f"engine not healthy at {self.url} within {self.health_timeout_s:g} s (log {log})")
                left = self.deadline()
                if left is not None and left <= 0:
                    raise DeadlineReached("deadline reached while the engine was starting (it keeps starting)")
                await asyncio.sleep(self.health_poll_s)
        argv = self._state.argv if self._state is not None else ()
        self._handle = EngineHandle(
            url=self.url, chunk_size=chunk_size, kind=self.kind, gpu=self.gpu, iteration_log=log, log_path=log,
            # vLLM captures CUDA graphs unless told not to (the seed's --enforce-eager ablation).
            cuda_graphs="--enforce-eager" not in argv if self.kind == "vllm" else None,
        )
        return self._handle

    def _forget(self, chunk_size: int) -> None:
        self.state_path(chunk_size).unlink(missing_ok=True)
        self._proc, self._state, self._handle = None, None, None

    async def stop(self) -> None:
        state, proc = self._state, self._proc
        if state is None:
            return
        await _terminate_group(state.pid, self.stop_timeout_s, proc)
        self._forget(state.chunk_size)

    def release(self) -> None:
        """Leave the engine running for a later invocation to adopt (its state file stays)."""
        self._proc, self._state, self._handle = None, None, None


async def _answers_health(url: str) -> bool:
    async with EngineClient(url, retries=1) as client:
        return await client.health()


def _log_tail(log: Path) -> str:
    try:
        lines = [line for line in log.read_text(errors="replace").splitlines() if line.strip()]
    except OSError:
        return "(no log)"
    return lines[-1][:300] if lines else "(empty log)"


async def _terminate_group(pid: int, timeout_s: float, proc: subprocess.Popen[bytes] | None = None) -> None:
    """SIGTERM to the engine's process group, SIGKILL after `timeout_s`."""

    def gone() -> bool:
        return proc.poll() is not None if proc is not None else not pid_alive(pid)

    if gone():
        return
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGTERM)
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        if gone():
            break
        await asyncio.sleep(0.1)
    else:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, signal.SIGKILL)
        for _ in range(50):
            if gone():
                break
            await asyncio.sleep(0.1)
    # The group's other members (workers) go with SIGTERM to the group; make sure none linger.
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)


# ---------------------------------------------------------------------------------------------
# Kubernetes launcher

CommandRunner = Callable[[Sequence[str]], Awaitable[tuple[int, str, str]]]


async def run_command(argv: Sequence[str]) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        *argv, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, stdin=asyncio.subprocess.DEVNULL
    )
    out, err = await proc.communicate()
    return proc.returncode or 0, out.decode("utf-8", "replace"), err.decode("utf-8", "replace")


def _scope(spec: KubernetesLauncherSpec) -> list[str]:
    out = []
    if spec.namespace:
        out += ["--namespace", spec.namespace]
    if spec.kube_context:
        out += ["--kube-context" if spec.tool == "helm" else "--context", spec.kube_context]
    return out


def helm_upgrade_argv(helm: str, spec: KubernetesLauncherSpec, chunk_size: int) -> list[str]:
    assert spec.release and spec.chart
    return [
        helm, "upgrade", spec.release, spec.chart, "--reuse-values",
        "--set", f"{spec.value_key}={chunk_size}",
        "--wait", "--timeout", f"{int(spec.rollout_timeout_s)}s", *_scope(spec),
    ]


def with_chunk_arg(args: Sequence[str], arg_name: str, chunk_size: int) -> list[str]:
    """Container args with `arg_name` set to the chunk size (both `--x=N` and `--x N` forms)."""
    out: list[str] = []
    found = False
    skip = False
    for i, arg in enumerate(args):
        if skip:
            skip = False
            continue
        if arg == arg_name and i + 1 < len(args):
            out += [arg_name, str(chunk_size)]
            skip, found = True, True
        elif arg.startswith(arg_name + "="):
            out.append(f"{arg_name}={chunk_size}")
            found = True
        else:
            out.append(arg)
    if not found:
        out += [arg_name, str(chunk_size)]
    return out


def kubectl_patch_argv(kubectl: str, spec: KubernetesLauncherSpec, current_args: Sequence[str] | None,
                       chunk_size: int) -> list[str]:
    path = f"/spec/template/spec/containers/{spec.container}/args"
    op = {"op": "replace" if current_args is not None else "add", "path": path,
          "value": with_chunk_arg(current_args or [], spec.arg_name, chunk_size)}
    return [kubectl, "patch", "deployment", str(spec.deployment), "--type=json", "-p",
            json.dumps([op], separators=(",", ":")), *_scope(spec)]


def kubectl_rollout_argv(kubectl: str, spec: KubernetesLauncherSpec) -> list[str]:
    return [kubectl, "rollout", "status", f"deployment/{spec.deployment}",
            f"--timeout={int(spec.rollout_timeout_s)}s", *_scope(spec)]


@dataclass
class KubernetesLauncher:
    spec: KubernetesLauncherSpec
    gpu: str | None = None
    runner: CommandRunner = run_command
    on_message: Callable[[str], None] = lambda text: None
    name: str = "kubernetes"
    commands: list[list[str]] = field(default_factory=list)  # what ran, for the log and tests
    _handle: EngineHandle | None = field(default=None, init=False, repr=False)

    @property
    def can_set_chunk_size(self) -> bool:
        return True

    def _tool(self) -> str:
        found = shutil.which(self.spec.tool)
        if found is None:
            raise ConfigError(f"launcher.tool: {self.spec.tool} is not on PATH")
        return found

    async def _run(self, argv: list[str]) -> str:
        self.commands.append(argv)
        self.on_message("running " + " ".join(shlex.quote(a) for a in argv))
        code, out, err = await self.runner(argv)
        if code != 0:
            detail = (err or out).strip().splitlines()[-1:] or [f"exit code {code}"]
            raise EngineError(f"{Path(argv[0]).name} {argv[1]} failed: {detail[0]}")
        return out

    async def start(self, chunk_size: int) -> EngineHandle:
        if self._handle is not None and self._handle.chunk_size == chunk_size:
            return self._handle
        tool = self._tool()
        if self.spec.tool == "helm":
            await self._run(helm_upgrade_argv(tool, self.spec, chunk_size))
        else:
            text = await self._run([tool, "get", "deployment", str(self.spec.deployment), "-o", "json", *_scope(self.spec)])
            try:
                containers = json.loads(text)["spec"]["template"]["spec"]["containers"]
                current = containers[self.spec.container].get("args")
            except (ValueError, KeyError, IndexError, TypeError) as exc:
                raise EngineError(
                    f"deployment {self.spec.deployment}: no container {self.spec.container} in its spec ({exc})"
                ) from None
            await self._run(kubectl_patch_argv(tool, self.spec, current, chunk_size))
            await self._run(kubectl_rollout_argv(tool, self.spec))
        async with EngineClient(self.spec.url) as client:
            await client.wait_healthy(self.spec.health_timeout_s)
        self._handle = EngineHandle(url=self.spec.url, chunk_size=chunk_size, kind="vllm", gpu=self.gpu)
        return self._handle

    async def stop(self) -> None:
        self._handle = None  # the deployment stays as it is; pdexporter does not own its life


# ---------------------------------------------------------------------------------------------
# Providers: a driver per chunk size


class EngineProvider(Protocol):
    """What the controller needs: a driver on an engine running at a chunk size."""

    description: str

    async def open(self, chunk_size: int) -> EngineDriver: ...

    async def close(self, *, stop_engine: bool) -> None:
        """Close the driver; stop the engine, or (stop_engine=False) leave it for a later run."""
        ...


@dataclass
class LauncherProvider:
    """HTTP drivers on engines from a `Launcher` (local, external, sim real-time, kubernetes)."""

    launcher: Launcher
    model: str | None = None
    api_key: str | None = None
    gpu: str | None = None
    description: str = ""
    log_dir_for: Callable[[int], Path] | None = None  # where a launcher with a `log_dir` logs
    _stack: contextlib.AsyncExitStack | None = field(default=None, init=False, repr=False)

    async def open(self, chunk_size: int) -> EngineDriver:
        await self._close_driver()
        if self.log_dir_for is not None and hasattr(self.launcher, "log_dir"):
            self.launcher.log_dir = self.log_dir_for(chunk_size)
        handle = await self.launcher.start(chunk_size)
        stack = contextlib.AsyncExitStack()
        try:
            driver = await stack.enter_async_context(http_driver(handle, model=self.model, api_key=self.api_key, gpu=self.gpu))
        except BaseException:
            await stack.aclose()
            raise
        self._stack = stack
        return driver

    async def _close_driver(self) -> None:
        stack, self._stack = self._stack, None
        if stack is not None:
            await stack.aclose()

    async def close(self, *, stop_engine: bool) -> None:
        await self._close_driver()
        release = getattr(self.launcher, "release", None)
        if not stop_engine and callable(release):
            release()
        else:
            await self.launcher.stop()


@dataclass
class VirtualSimProvider:
    """The embedded engine in-process on a virtual clock (run the controller under `run_virtual`)."""

    profile: Any  # a profile name, path or `sim.profile.Profile`
    model: str | None = None
    gpu: str | None = None
    description: str = ""
    _driver: Any = field(default=None, init=False, repr=False)

    async def open(self, chunk_size: int) -> EngineDriver:
        from pdexporter.sim.driver import SimDriver  # the embedded engine (sim package)

        await self.close(stop_engine=True)
        self._driver = SimDriver.create(profile=self.profile, chunk_size=chunk_size)
        return self._driver

    async def close(self, *, stop_engine: bool) -> None:
        driver, self._driver = self._driver, None
        if driver is not None:
            await driver.aclose()


def make_provider(
    spec: SweepSpec,
    store: ResultsStore,
    *,
    api_key: str | None = None,
    deadline: Callable[[], float | None] = lambda: None,
    on_message: Callable[[str], None] = lambda text: None,
) -> EngineProvider:
    launcher_spec = spec.launcher
    if isinstance(launcher_spec, SimLauncherSpec):
        if launcher_spec.clock == "virtual":
            return VirtualSimProvider(launcher_spec.profile, model=spec.model, gpu=spec.gpu,
                                      description=f"embedded engine {launcher_spec.profile}, virtual clock")
        sim = SimLauncher(profile=launcher_spec.profile)
        return LauncherProvider(sim, model=spec.model, api_key=api_key, gpu=None, log_dir_for=store.engine_dir,
                                description=f"embedded engine {launcher_spec.profile}, real time over HTTP")
    launcher: Launcher
    if isinstance(launcher_spec, LocalLauncherSpec):
        launcher = LocalLauncher(
            command=launcher_spec.command, store=store, url=launcher_spec.url, variables=dict(launcher_spec.vars),
            env=dict(launcher_spec.env), cwd=launcher_spec.cwd, health_timeout_s=launcher_spec.health_timeout_s,
            stop_timeout_s=launcher_spec.stop_timeout_s, adopt=launcher_spec.adopt, gpu=spec.gpu,
            deadline=deadline, on_message=on_message,
        )
        what = f"local engine at {launcher_spec.url}"
    elif isinstance(launcher_spec, ExternalLauncherSpec):
        launcher = ExternalLauncher(url=launcher_spec.url, chunk_size=launcher_spec.chunk_size, gpu=spec.gpu)
        what = f"external engine at {launcher_spec.url}"
    elif isinstance(launcher_spec, KubernetesLauncherSpec):
        launcher = KubernetesLauncher(launcher_spec, gpu=spec.gpu, on_message=on_message)
        what = f"Kubernetes ({launcher_spec.tool}) engine at {launcher_spec.url}"
    else:  # pragma: no cover - the schema admits no other kind
        raise ConfigError(f"launcher.kind: {launcher_spec!r}")
    return LauncherProvider(launcher, model=spec.model, api_key=api_key, gpu=spec.gpu, description=what)
