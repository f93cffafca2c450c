"""What every way of getting an engine shares: the handle a started engine is known by, the
`Launcher` protocol, the optional capabilities a launcher may have (typed protocols the sweep
controller checks with isinstance, not getattr), and the one way pdexporter stops a process
group it started.

A sweep changes the engine's chunk size (vLLM's `--max-num-batched-tokens`, SGLang's
`--chunked-prefill-size`: the adapter's `chunk_flag`) between blocks of the grid, which means a
restart. `EngineHandle.iteration_log` is the engine's log file when the launcher owns it; with the
adapter's step-log flags (`chunk_size_flags`) or always (embedded engine) it carries one line per
step, which the engine adapter turns into exact chunk sizes. `EngineHandle.kind` is the engine
adapter's name when the launcher knows it (from its engine and command line), None when only the
engine can say (`client.identity`).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, runtime_checkable

from pdexporter._internal.procs import pid_alive, process_start_ticks

__all__ = [
    "Adopting", "Attaching", "DeadlineReached", "EngineDirs", "EngineHandle", "Launcher", "LogDirected", "Prestarting",
    "Releasing", "TraceDirected", "pid_alive", "process_start_ticks", "terminate_group",
]


class DeadlineReached(Exception):
    """Raised between runs when the next one would not finish before `--deadline`."""


@dataclass(frozen=True)
class EngineHandle:
    url: str
    chunk_size: int | None
    kind: str | None = None  # the engine adapter's name; None: ask the engine (`client.identity`)
    modelled: bool = False
    gpu: str | None = None
    version: str | None = None
    profile: str | None = None
    cuda_graphs: bool | None = None
    iteration_log: Path | None = None
    log_path: Path | None = None
    command: tuple[str, ...] | None = None  # how the engine was started, secrets redacted (None: unknown)


class EngineDirs(Protocol):
    """Where a launcher keeps its engines' logs and state files: a results directory's layout
    (`measure.store.ResultsStore` is one: `{root}/{chunk}/engine/`)."""

    @property
    def root(self) -> Path: ...

    def engine_dir(self, chunk_size: int) -> Path: ...


@runtime_checkable
class Launcher(Protocol):
    name: str

    @property
    def can_set_chunk_size(self) -> bool: ...

    async def start(self, chunk_size: int) -> EngineHandle:
        """Have an engine with this chunk size serving; restart it if it runs another."""
        ...

    async def stop(self) -> None: ...


@runtime_checkable
class Adopting(Protocol):
    """A launcher that can take over an engine an earlier invocation left running."""

    adopted: bool  # did the last start() adopt one?

    def can_adopt(self, chunk_size: int) -> bool:
        """Would `start(chunk_size)` adopt a live engine instead of starting one?"""
        ...


@runtime_checkable
class Attaching(Protocol):
    """A launcher that starts no engine: `start()` only attaches to one already serving (someone
    else's, `--target`), at once. A sweep's deadline budgets no start-up for it."""

    def attaches(self, chunk_size: int) -> bool:
        """Would `start(chunk_size)` attach to a running engine instead of starting one?"""
        ...


@runtime_checkable
class TraceDirected(Protocol):
    """A launcher whose engine can be told where to send its per-request traces (OTLP/HTTP),
    before it starts: `pdexporter run --passive` points the embedded engine at its own /v1/traces.
    `env`: the OTLP exporter's settings besides the endpoint (`OTEL_EXPORTER_OTLP_TRACES_HEADERS`
    for the receiver's token, `..._CERTIFICATE` for its TLS certificate)."""

    def send_traces_to(self, endpoint: str, env: Mapping[str, str] | None = None) -> None: ...


@runtime_checkable
class Prestarting(Protocol):
    """A launcher that can set an engine starting without waiting for it (for the next run)."""

    async def prestart(self, chunk_size: int) -> None: ...


@runtime_checkable
class Preparing(Protocol):
    """A launcher that can start the engine of the chunk size to come while the current one serves,
    up to the GPU (`launch.overlap`): `start` of that chunk size then pays only the GPU's part."""

    async def prepare(self, chunk_size: int) -> None: ...


@runtime_checkable
class Releasing(Protocol):
    """A launcher that can leave its engine running for a later invocation."""

    def release(self) -> None: ...


@runtime_checkable
class LogDirected(Protocol):
    """A launcher whose engine log goes where it is told (a sweep: `{chunk}/engine/`)."""

    log_dir: Path | None


async def terminate_group(pid: int, timeout_s: float, proc: subprocess.Popen[bytes] | None = None) -> None:
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
    if proc is not None:
        with contextlib.suppress(Exception):
            proc.wait(timeout=1.0)  # reap it


