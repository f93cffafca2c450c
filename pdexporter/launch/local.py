"""The `local` launcher: the engine from a command template, in its own process session.

Its log goes to `results/{chunk}/engine/engine.log` (exposed as `EngineHandle.iteration_log`, so
chunk sizes come from the engine's step lines: vLLM's `--enable-logging-iteration-details`,
SGLang's `--decode-log-interval 1`; `launcher.engine` names the adapter), with a state file
beside it (`engine.json`: pid, command, url, chunk size). A later invocation *adopts* a live
engine that file describes when it has the chunk size wanted (same process and command line,
/health answers, no logged step larger than the chunk), so a sweep stopped by a time limit and
rerun does not pay vLLM's ~100 s start again; an engine of another chunk size it stops. Stopping
is SIGTERM to the process group, then SIGKILL after `stop_timeout_s` (`base.terminate_group`).

Several engines, one per GPU (a sweep file's `launcher.gpus`), share one results directory: each
launcher has its own url (port), and the other engines' urls are its `siblings`. A launcher
adopts or stops the engines of its own url (and those of no current engine, left by an earlier
run with other GPUs); a sibling's engine it leaves alone unless it is about to start that
engine's chunk size itself.

Engines die with their owner (Linux). The engine is started through a *leash*
(`launch.leash`), a small process that holds the engine (its own session, and a parent-death
signal: if the leash dies, the kernel stops the engine) and a channel to the pdexporter that owns
it. When the owner exits or is killed (SIGKILL included) without *releasing* the engine, the
leash stops it at once. A release (`release()`: a sweep stopping at `--deadline`, `--keep-engine`,
`prestart`) keeps it running, unowned; the next invocation takes it over through the leash's
socket (named in the state file) and adopts or stops it as above. An engine owned by another live
pdexporter (two sweeps on one results directory), run by another user (its process, or its state
file, not this user's), or whose leash lives but does not answer is refused in one line: on Linux
an engine is adopted with its leash or not at all (one without a leash, an older pdexporter's, is
stopped and started again). Elsewhere than Linux the state file is all there is: a later
invocation adopts or stops what it finds.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import json
import os
import platform
import re
import shlex
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pdexporter._internal.atomic import atomic_write_json, open_private_log
from pdexporter._internal.gate import GATE_ENV, hook_dir
from pdexporter._internal.procs import same_process
from pdexporter._internal.redact import (
    known_secrets,
    redact_argv,
    redact_text,
    remember_secret,
    secret_pattern,
    secret_values,
    without_own_secrets,
)
from pdexporter.client.client import EngineClient
from pdexporter.engines import adapter
from pdexporter.errors import ConfigError, EngineError, EngineTimeout
from pdexporter.launch.base import (
    DeadlineReached,
    EngineDirs,
    EngineHandle,
    pid_alive,
    process_start_ticks,
    terminate_group,
)

__all__ = [
    "EngineState", "GATE_FILE", "LEASH", "LEASHED", "LOG_FILE", "LocalLauncher", "RenderedCommand", "STATE_FILE",
    "log_contradicts_chunk", "render_command", "state_is_live",
]

STATE_FILE = "engine.json"
LOG_FILE = "engine.log"
GATE_FILE = "start-gate"  # a gated launcher's engine waits before the GPU until this file exists
LEASH = Path(__file__).with_name("leash.py")
LEASHED = sys.platform.startswith("linux")  # abstract unix sockets and PR_SET_PDEATHSIG


# ---------------------------------------------------------------------------------------------
# Command templates (pure)


@dataclass(frozen=True)
class RenderedCommand:
    argv: tuple[str, ...]
    env: dict[str, str]
    # values that came from a secret-looking variable, environment name or flag: hidden wherever
    # they were substituted (`launcher.vars.DB_CREDS` in a positional argument, say)
    secrets: tuple[str, ...] = ()

    @property
    def text(self) -> str:
        """The command line as it may be written down: secret values redacted."""
        return " ".join(shlex.quote(w) for w in self.redacted)

    @property
    def redacted(self) -> tuple[str, ...]:
        """`NAME=value` words for the environment, then argv; secret values replaced by ***."""
        words = redact_argv([*(f"{k}={v}" for k, v in self.env.items()), *self.argv])
        return tuple(redact_text(w, self.secrets) for w in words)


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
    secrets = secret_values(variables=variables, env=assigns, argv=words)
    return RenderedCommand(tuple(words), assigns, tuple(secrets))


# ---------------------------------------------------------------------------------------------
# Local process launcher


@dataclass(frozen=True)
class EngineState:
    pid: int
    argv: tuple[str, ...]  # the command line as `RenderedCommand.redacted` (environment words first)
    url: str
    chunk_size: int
    log: str
    host: str
    started_at: str
    proc_start: int | None  # the process's start time in clock ticks since boot (/proc/PID/stat)
    leash_pid: int | None = None  # the leash holding the engine (`launch.leash`), and its start time
    leash_start: int | None = None
    leash_socket: str | None = None  # the leash's abstract unix socket, for a later owner
    gate: str | None = None  # its start gate's file (`_internal.gate`): held before the GPU until it exists

    @property
    def held(self) -> bool:
        """Started behind a gate that is still closed: it has not touched the GPU."""
        return self.gate is not None and not os.path.exists(self.gate)

    def to_json(self) -> dict[str, Any]:
        return {
            "pid": self.pid, "argv": list(self.argv), "url": self.url, "chunk_size": self.chunk_size,
            "log": self.log, "host": self.host, "started_at": self.started_at, "proc_start": self.proc_start,
            "leash_pid": self.leash_pid, "leash_start": self.leash_start, "leash_socket": self.leash_socket,
            "gate": self.gate,
        }

    @classmethod
    def read(cls, path: Path) -> EngineState | None:
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
            def opt_int(key: str) -> int | None:
                return None if data.get(key) is None else int(data[key])

            return cls(int(data["pid"]), tuple(data["argv"]), str(data["url"]), int(data["chunk_size"]),
                       str(data["log"]), str(data["host"]), str(data["started_at"]), opt_int("proc_start"),
                       opt_int("leash_pid"), opt_int("leash_start"),
                       None if data.get("leash_socket") is None else str(data["leash_socket"]),
                       None if data.get("gate") is None else str(data["gate"]))
        except (OSError, ValueError, KeyError, TypeError):
            return None


def state_is_live(state: EngineState) -> bool:
    """The process the state file recorded is still running (same pid, same start time)."""
    if state.host != platform.node() or not pid_alive(state.pid):
        return False
    start = process_start_ticks(state.pid)
    return start is None or state.proc_start is None or start == state.proc_start


def log_contradicts_chunk(log: Path, chunk_size: int, kind: str, tail_bytes: int = 4 << 20) -> bool:
    """True if the engine's own step log (read by adapter `kind`) shows a step larger than the chunk size."""
    try:
        with log.open("rb") as handle:
            handle.seek(max(0, log.stat().st_size - tail_bytes))
            text = handle.read().decode("utf-8", "replace")
    except OSError:
        return False
    steps = adapter(kind).parse_step_log(text.splitlines())
    return any(s.context_tokens + s.generation_tokens > chunk_size for s in steps)


@dataclass
class LocalLauncher:
    command: str
    store: EngineDirs  # the results directory (`measure.store.ResultsStore`)
    url: str = "http://127.0.0.1:8000"
    variables: dict[str, str] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)
    cwd: str | None = None
    health_timeout_s: float = 600.0
    stop_timeout_s: float = 60.0
    adopt: bool = True
    health_poll_s: float = 0.1
    engine: str = "vllm"  # the adapter of the engine the command starts (`launcher.engine`)
    gpu: str | None = None
    deadline: Callable[[], float | None] = lambda: None  # seconds left, or None
    on_message: Callable[[str], None] = lambda text: None
    siblings: frozenset[str] = frozenset()  # urls of the sweep's other engines (one per GPU)
    name: str = "local"
    # One instance of a P/D pair ("prefill" | "decode", launch/pair.py): its state and log live in
    # `{chunk}/engine/{role}/`, and its engine setup follows from its command's --kv-transfer-config.
    role: str | None = None
    # Engines start behind a gate (`_internal.gate`): `prepare` starts one that waits before the GPU
    # (its imports, config, tokenizer and engine-core process done) while another engine serves;
    # `start` lets it through once no other engine of the results directory runs (launch/overlap.py).
    gated: bool = False
    adopted: bool = field(default=False, init=False)
    _proc: subprocess.Popen[bytes] | None = field(default=None, init=False, repr=False)
    _state: EngineState | None = field(default=None, init=False, repr=False)
    _handle: EngineHandle | None = field(default=None, init=False, repr=False)
    _control: socket.socket | None = field(default=None, init=False, repr=False)  # the leash's owner channel

    @property
    def can_set_chunk_size(self) -> bool:
        return True

    def _engine_dir(self, chunk_size: int) -> Path:
        base = self.store.engine_dir(chunk_size)
        return base / self.role if self.role else base

    def state_path(self, chunk_size: int) -> Path:
        return self._engine_dir(chunk_size) / STATE_FILE

    def log_path(self, chunk_size: int) -> Path:
        return self._engine_dir(chunk_size) / LOG_FILE

    def _known_states(self) -> list[tuple[Path, EngineState]]:
        out = []
        if self.store.root.is_dir():
            pattern = f"*/engine/{self.role}/{STATE_FILE}" if self.role else f"*/engine/{STATE_FILE}"
            for path in sorted(self.store.root.glob(pattern)):
                state = EngineState.read(path)
                if state is not None:
                    out.append((path, state))
        return out

    async def start(self, chunk_size: int) -> EngineHandle:
        if self._handle is not None and self._handle.chunk_size == chunk_size and self._alive():
            return self._handle
        if self.holds(chunk_size):  # started by `prepare`: through its gate once the GPU is free
            await self._let_through()
        else:
            await self._launch(chunk_size)
        return await self._ready(chunk_size)

    async def prepare(self, chunk_size: int) -> None:
        """Start the engine for a later chunk size behind its closed gate and return at once (a
        `gated` launcher; others do nothing): it does its CPU-side start-up beside the engine in
        use and waits before the GPU until `start` or `prestart` opens the gate."""
        if self.gated and not self.holds(chunk_size):
            await self._launch(chunk_size, gate_open=False)

    @property
    def idle(self) -> bool:
        """No engine of this launcher's runs or is held (it has stopped, released, or not started one)."""
        return self._state is None

    def url_taken(self, chunk_size: int) -> bool:
        """A live engine of another chunk size, started from this results directory, has this
        launcher's url (its port): starting here would stop it."""
        return any(state.url == self.url and state.chunk_size != chunk_size and state_is_live(state)
                   for _, state in self._known_states())

    def holds(self, chunk_size: int) -> bool:
        """This launcher runs (or holds at its gate) an engine of this chunk size."""
        return self._state is not None and self._state.chunk_size == chunk_size and self._alive()

    async def _let_through(self) -> None:
        """Open this launcher's engine's gate, once every other engine of this results directory
        that is past its own is stopped (it holds the GPU's memory)."""
        own = self._state.pid if self._state is not None else None
        for path, state in self._known_states():
            if state.pid == own or not state_is_live(state) or state.held:
                continue
            await self._stop_found(state, path, await self._take_over(state, path))
        if self._state is not None and self._state.gate is not None:
            Path(self._state.gate).touch()

    async def _stop_found(self, state: EngineState, path: Path, control: socket.socket | None) -> None:
        """Stop an engine found in this results directory (taken over: `control`) and drop its state file."""
        self.on_message(f"stopping engine pid {state.pid} (chunk {state.chunk_size}, {state.url})")
        await terminate_group(state.pid, self.stop_timeout_s)
        if control is not None:
            control.close()
        mask_secrets_in_log(Path(state.log))
        path.unlink(missing_ok=True)

    def _sibling_keeps(self, state: EngineState, chunk_size: int) -> bool:
        """Another engine of this sweep runs it, and not the chunk size we are about to start."""
        return state.url != self.url and state.url in self.siblings and state.chunk_size != chunk_size

    async def prestart(self, chunk_size: int) -> None:
        """Have the engine for this chunk size starting, without waiting for it: a sweep that
        has no time left to wait starts the next engine and exits; the next invocation adopts it."""
        if self.holds(chunk_size):
            await self._let_through()
        else:
            await self._launch(chunk_size)
        self.release()

    def can_adopt(self, chunk_size: int) -> bool:
        """Whether `start(chunk_size)` would adopt a live engine instead of starting one."""
        if not self.adopt:
            return False
        wanted = render_command(self.command, chunk_size, self.variables, self.env)
        return any(
            state_is_live(state) and state.chunk_size == chunk_size and state.argv == wanted.redacted
            and not log_contradicts_chunk(Path(state.log), chunk_size, self._setup(wanted.argv))
            for _, state in self._known_states()
        )

    async def _launch(self, chunk_size: int, *, gate_open: bool = True) -> None:
        """Adopt a live engine of this chunk size, or stop others and start one (state file first).
        `gate_open=False` (`prepare`): behind a closed gate, leaving every other engine running."""
        await self.stop()
        # Engines this results directory started earlier: adopt the one we want, stop the others
        # (they hold the GPU and the port). A gated launcher about to use the GPU also stops a
        # sibling's engine that is past its gate; one still held uses no GPU and may stay.
        for path, state in self._known_states():
            if not state_is_live(state):
                path.unlink(missing_ok=True)
                continue
            if self._sibling_keeps(state, chunk_size) and not (self.gated and gate_open and not state.held):
                continue
            control = await self._take_over(state, path)
            wanted = render_command(self.command, chunk_size, self.variables, self.env)
            if self.adopt and state.chunk_size == chunk_size and state.argv == wanted.redacted:
                if control is None and LEASHED:  # it would outlive this invocation's kill -9
                    self.on_message(f"engine pid {state.pid} has no leash to hold it by; restarting")
                elif log_contradicts_chunk(Path(state.log), chunk_size, self._setup(wanted.argv)):
                    self.on_message(
                        f"engine pid {state.pid}: its log shows steps above {chunk_size} tokens; restarting"
                    )
                else:
                    self.on_message(f"adopting the engine started earlier (pid {state.pid}, chunk {chunk_size})")
                    self._state, self._control = state, control
                    self.adopted = True
                    if gate_open:
                        await self._let_through()
                    return
            await self._stop_found(state, path, control)
        if await _answers_health(self.url):
            raise EngineError(
                f"{self.url} already answers /health but this sweep did not start it (no live "
                f"{STATE_FILE} under {self.store.root}): stop that engine, or use the external launcher"
            )
        rendered = render_command(self.command, chunk_size, self.variables, self.env)
        for secret in rendered.secrets:  # never printed or written (the engine's log: `mask_secrets_in_log`)
            remember_secret(secret)
        log = self.log_path(chunk_size)
        gate = self._engine_dir(chunk_size) / GATE_FILE if self.gated else None
        if gate is not None:
            gate.parent.mkdir(parents=True, exist_ok=True)
            if gate_open:
                gate.touch()
            else:
                gate.unlink(missing_ok=True)
        with open_private_log(log) as out:  # 0600: vLLM logs its arguments, an API key among them
            held = "" if gate is None or gate_open else f" (held before the GPU until {gate} exists)"
            out.write(f"\n# pdexporter sweep: starting {rendered.text}{held}\n".encode())
            out.flush()
            # iteration lines in the log at once; pdexporter's own secrets are not the engine's
            env = {**without_own_secrets(os.environ), "PYTHONUNBUFFERED": "1", **rendered.env}
            if gate is not None:
                env = gated_env(env, gate)
            if LEASHED:
                engine_pid, leash = await self._start_leashed(rendered, out, env)
            else:
                engine_pid, leash = self._popen(list(rendered.argv), rendered, out, env).pid, None
        self._state = EngineState(
            pid=engine_pid, argv=rendered.redacted, url=self.url, chunk_size=chunk_size, log=str(log),
            host=platform.node(), started_at=dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
            proc_start=process_start_ticks(engine_pid),
            leash_pid=leash[0] if leash else None, leash_start=process_start_ticks(leash[0]) if leash else None,
            leash_socket=leash[1] if leash else None, gate=None if gate is None else str(gate),
        )
        atomic_write_json(self.state_path(chunk_size), self._state.to_json())
        self.adopted = False

    def _popen(self, argv: list[str], rendered: RenderedCommand, out: Any, env: dict[str, str],
               stdin: Any = subprocess.DEVNULL) -> subprocess.Popen[bytes]:
        try:
            self._proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, stdin=stdin, env=env,
                                          cwd=self.cwd, start_new_session=True)
        except OSError as exc:
            raise ConfigError(f"launcher.command: cannot run {rendered.argv[0]!r} ({exc.strerror or exc})") from None
        return self._proc

    async def _start_leashed(self, rendered: RenderedCommand, out: Any,
                             env: dict[str, str]) -> tuple[int, tuple[int, str]]:
        """The engine under a leash (`launch.leash`): its pid, and the leash's pid and socket."""
        ours, theirs = socket.socketpair()
        try:
            # The engine's command line goes on the channel, not on the leash's own (launch.leash).
            leash = self._popen([sys.executable, "-I", str(LEASH), "--stop-timeout", f"{self.stop_timeout_s:g}"],
                                rendered, out, env, stdin=theirs)
            ours.sendall(f"argv {json.dumps(list(rendered.argv))}\n".encode())
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()
        ours.setblocking(False)
        self._control = ours
        said: dict[str, str] = {}
        buffer = b""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 30.0
        while not ({"engine", "socket"} <= said.keys() or "error" in said):
            try:
                async with asyncio.timeout(max(0.1, deadline - loop.time())):
                    chunk = await loop.sock_recv(ours, 4096)
            except TimeoutError:
                chunk = b""
            if not chunk:
                await self._drop_control()
                raise EngineError(f"the engine's leash did not start it (exit code {leash.poll()}; log {out.name})")
            buffer += chunk
            *lines, buffer = buffer.split(b"\n")
            for line in lines:
                key, _, value = line.decode(errors="replace").partition(" ")
                said[key] = value
        if "error" in said:
            await self._drop_control()
            raise ConfigError(f"launcher.command: cannot run {rendered.argv[0]!r} ({said['error']})")
        return int(said["engine"]), (leash.pid, said["socket"])

    async def _take_over(self, state: EngineState, path: Path) -> socket.socket | None:
        """Become the owner of a live engine an earlier invocation started: its leash's channel,
        or None for an engine without a (live) leash. Refused when a live owner holds it, when
        another user runs it, and when its leash lives but does not answer: an engine adopted
        without its leash would outlive this invocation's kill -9 (issue 31)."""
        foreign = _foreign(state, path)
        if foreign:
            raise EngineError(f"engine pid {state.pid} ({path}): {foreign}: only its owner may adopt or stop it")
        if not (state.leash_socket and state.leash_pid and same_process(state.leash_pid, state.leash_start)):
            return None
        reply, conn = "", None
        for _ in range(3):  # a connection refused for a moment (a full backlog) is tried again; silence is not
            reply, conn = await _ask_leash(state.leash_socket)
            if conn is not None or reply:
                break
            await asyncio.sleep(0.5)
        if conn is not None:
            return conn
        if not reply or reply == _NO_ANSWER:
            raise EngineError(f"engine pid {state.pid} ({path}): its leash (pid {state.leash_pid}) does not answer; "
                              "not adopting it without the leash: stop that engine, or run again")
        if reply.startswith("not yours"):
            raise EngineError(f"engine pid {state.pid} ({path}) was started by another user: only its owner may adopt "
                              "or stop it")
        raise EngineError(f"engine pid {state.pid} ({path}) belongs to another running pdexporter: wait for it to "
                          "finish, or stop it")

    async def _drop_control(self) -> None:
        control, self._control = self._control, None
        if control is not None:
            control.close()

    def _alive(self) -> bool:
        if self._state is not None and self._state.leash_pid is not None:
            return same_process(self._state.pid, self._state.proc_start)
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
                    mask_secrets_in_log(log)
                    tail = _start_failure(log, self.engine)
                    self._forget(chunk_size)
                    raise EngineError(f"engine exited during start-up (log {log}): {tail}")
                if await client.health():
                    break
                if time.monotonic() > deadline:
                    await self.stop()
                    raise EngineTimeout(
                        f"engine not healthy at {self.url} within {self.health_timeout_s:g} s (log {log})"
                    )
                left = self.deadline()
                if left is not None and left <= 0:
                    raise DeadlineReached("deadline reached while the engine was starting (it keeps starting)")
                await asyncio.sleep(self.health_poll_s)
        mask_secrets_in_log(log)  # what the engine printed of its arguments while it started
        argv = self._state.argv if self._state is not None else ()
        kind = self._setup(argv)  # e.g. SGLang's --enable-mixed-chunk, vLLM's DecodeBenchConnector
        self._handle = EngineHandle(
            url=self.url, chunk_size=chunk_size, kind=kind, gpu=self.gpu, iteration_log=log, log_path=log,
            cuda_graphs=adapter(kind).cuda_graphs(argv), command=argv,
        )
        return self._handle

    def _setup(self, argv: tuple[str, ...]) -> str:
        """The engine setup (adapter name) this command line starts, in this launcher's pair role."""
        return adapter(self.engine).for_command(argv, self.role)

    def _forget(self, chunk_size: int) -> None:
        self.state_path(chunk_size).unlink(missing_ok=True)
        leash, self._proc, self._state, self._handle = self._proc, None, None, None
        if self._control is not None:
            self._control.close()  # the leash stops what is left and exits
            self._control = None
        if leash is not None and isinstance(leash.args, list) and leash.args[:2] == [sys.executable, "-I"]:
            with contextlib.suppress(subprocess.TimeoutExpired):
                leash.wait(timeout=5.0)  # it exits once its engine is gone: reap it

    async def stop(self) -> None:
        state, proc = self._state, self._proc
        if state is None:
            return
        leashed = state.leash_pid is not None
        await terminate_group(state.pid, self.stop_timeout_s, None if leashed else proc)
        mask_secrets_in_log(Path(state.log))
        self._forget(state.chunk_size)

    def release(self) -> None:
        """Leave the engine running for a later invocation to adopt (its state file stays): the
        leash is told, so that this process's exit does not stop it."""
        if self._control is not None:
            with contextlib.suppress(OSError):
                self._control.setblocking(True)
                self._control.sendall(b"release\n")
            self._control.close()
            self._control = None
        self._proc, self._state, self._handle = None, None, None


def mask_secrets_in_log(log: Path) -> int:
    """Every secret the process holds (`_internal.redact.known_secrets`: the sweep's launcher secrets,
    the engine key) overwritten in the engine's log by as many `*` (vLLM logs its arguments, an API
    key among them, and an engine may echo its environment): the log's length and every offset in it
    stay (its step lines are read by offset), so this may run while the engine still writes. Returns
    how many were masked; a log that cannot be read or written is left as it is (it is 0600)."""
    secrets = known_secrets()
    if not secrets:
        return 0
    count = 0
    try:
        with open(log, "r+b") as f:
            masked = f.read()
            for secret in sorted(secrets, key=len, reverse=True):  # a longer form first: its shorter ones inside it
                # where `redact` would hide it (a short one only as a whole word), by as many bytes
                masked, n = re.subn(secret_pattern(secret).encode(), b"*" * len(secret.encode()), masked)
                count += n
            if count:
                f.seek(0)
                f.write(masked)
    except OSError:
        return 0
    return count


def gated_env(env: dict[str, str], gate: Path) -> dict[str, str]:
    """An engine's environment behind the start gate: the hook first on PYTHONPATH, and the gate
    file. Nothing else: vLLM hashes its VLLM_* variables into the torch.compile cache key (0.22,
    `envs.compile_factors`), so a `VLLM_ENGINE_READY_TIMEOUT_S` set here cost GPU session 9 its
    warm compile cache (~25 s a start)."""
    path = env.get("PYTHONPATH")
    hook = str(hook_dir())
    return {**env, GATE_ENV: str(gate), "PYTHONPATH": f"{hook}{os.pathsep}{path}" if path else hook}


_NO_ANSWER = "(no answer)"


async def _ask_leash(name: str) -> tuple[str, socket.socket | None]:
    """Say `own` on a leash's socket: (its reply, the connection when it said ok); ("", None)
    when it could not be asked, (`_NO_ANSWER`, None) when it did not answer within 5 s: a leash
    that held a connection that long is not asked again (a stopped one held the caller 16 s)."""
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    conn.setblocking(False)
    loop = asyncio.get_running_loop()
    try:
        async with asyncio.timeout(5.0):
            await loop.sock_connect(conn, "\0" + name)
            await loop.sock_sendall(conn, b"own\n")
            reply = (await loop.sock_recv(conn, 64)).decode(errors="replace")
    except TimeoutError:
        conn.close()
        return _NO_ANSWER, None
    except OSError:
        conn.close()
        return "", None
    if reply.startswith("ok"):
        return reply, conn
    conn.close()
    return reply or "(hung up)", None


def _foreign(state: EngineState, path: Path) -> str:
    """Why an engine a state file describes is not this user's to adopt or stop ("" when it is):
    the state file written by another user, or writable by others, or the process another user's."""
    uid = os.getuid()
    try:
        info = path.stat()
    except OSError:
        return ""
    if info.st_uid != uid:
        return f"its state file belongs to uid {info.st_uid}, not this user's ({uid})"
    if info.st_mode & 0o022:
        return f"its state file is writable by others (mode {info.st_mode & 0o777:o})"
    try:
        owner = Path(f"/proc/{state.pid}").stat().st_uid
    except OSError:
        return ""
    return f"the process runs as uid {owner}, not this user's ({uid})" if owner != uid else ""


async def _answers_health(url: str) -> bool:
    async with EngineClient(url, retries=1) as client:
        return await client.health()


def _start_failure(log: Path, engine: str) -> str:
    """The line of a failed start's log (its last 64 kB) that says why, as the engine's adapter finds it:
    vLLM's engine core exception, not the API server's "see root cause above" after it."""
    try:
        with log.open("rb") as f:
            f.seek(max(f.seek(0, 2) - 65536, 0))
            text = f.read().decode(errors="replace")
    except OSError:
        return "(no log)"
    return adapter(engine).start_failure(text.splitlines())[:400]


