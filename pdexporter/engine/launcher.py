"""Engines that pdexporter measures: started, restarted per chunk size, and stopped.

A sweep changes the engine's `max_num_batched_tokens` (the chunk size) between blocks of the
grid, which on vLLM means a restart. Every way of getting an engine implements `Launcher`:

- `ExternalLauncher`: an engine someone else runs; it cannot change the chunk size, so it
  refuses a chunk size other than the one it was told the engine has.
- `SimLauncher`: pdexporter's embedded engine (`pdexporter sim serve`) in a subprocess, in real
  time, so probe timing goes through real HTTP exactly as against vLLM.
- `LocalLauncher` and `KubernetesLauncher` (in `pdexporter.sweep.launchers`): a vLLM command
  template, or a Helm release.

`EngineHandle.iteration_log` is the engine's log file when the launcher owns it; with
`--enable-logging-iteration-details` (vLLM) or always (embedded engine) it carries one line per
step, which `engine.iterlog` turns into exact chunk sizes.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol, runtime_checkable

from pdexporter.errors import ConfigError, EngineError, EngineTimeout


@dataclass(frozen=True)
class EngineHandle:
    url: str
    chunk_size: int | None
    kind: str = "openai-compatible"
    modelled: bool = False
    gpu: str | None = None
    version: str | None = None
    profile: str | None = None
    cuda_graphs: bool | None = None
    iteration_log: Path | None = None
    log_path: Path | None = None


@runtime_checkable
class Launcher(Protocol):
    name: str

    @property
    def can_set_chunk_size(self) -> bool: ...

    async def start(self, chunk_size: int) -> EngineHandle:
        """Have an engine with this chunk size serving; restart it if it runs another."""
        ...

    async def stop(self) -> None: ...


@dataclass
class ExternalLauncher:
    """An engine already running. `chunk_size` is what the operator says it was started with."""

    url: str
    chunk_size: int | None = None
    gpu: str | None = None
    name: str = "external"

    @property
    def can_set_chunk_size(self) -> bool:
        return False

    async def start(self, chunk_size: int) -> EngineHandle:
        if self.chunk_size is not None and chunk_size != self.chunk_size:
            raise ConfigError(
                f"chunk size {chunk_size}: the external engine at {self.url} runs with "
                f"max_num_batched_tokens={self.chunk_size} and pdexporter cannot restart it; "
                "use a launcher that owns the engine (local, sim, kubernetes)"
            )
        return EngineHandle(url=self.url, chunk_size=self.chunk_size or chunk_size, kind="vllm", gpu=self.gpu)

    async def stop(self) -> None:
        return None


@dataclass
class SimLauncher:
    """The embedded engine in a child process, on real time, serving vLLM's HTTP API."""

    profile: str = "h200-qwen3-coder-30b-a3b"
    host: str = "127.0.0.1"
    port: int = 0
    extra_args: tuple[str, ...] = ()
    log_dir: Path | None = None
    start_timeout_s: float = 60.0
    name: str = "sim"
    _proc: subprocess.Popen[bytes] | None = field(default=None, repr=False)
    _chunk: int | None = field(default=None, repr=False)
    _handle: EngineHandle | None = field(default=None, repr=False)
    _tmp: tempfile.TemporaryDirectory[str] | None = field(default=None, repr=False)

    @property
    def can_set_chunk_size(self) -> bool:
        return True

    async def start(self, chunk_size: int) -> EngineHandle:
        if self._proc is not None and self._proc.poll() is None and self._chunk == chunk_size and self._handle:
            return self._handle
        await self.stop()
        if self.log_dir is None:
            self._tmp = tempfile.TemporaryDirectory(prefix="pdexporter-sim-")
            log_dir = Path(self._tmp.name)
        else:
            log_dir = Path(self.log_dir)
            log_dir.mkdir(parents=True, exist_ok=True)
        ready = log_dir / f"sim-{chunk_size}.ready.json"
        ready.unlink(missing_ok=True)
        log_path = log_dir / f"sim-{chunk_size}.log"
        cmd = [
            sys.executable, "-m", "pdexporter", "sim", "serve",
            "--profile", self.profile,
            "--max-num-batched-tokens", str(chunk_size),
            "--host", self.host, "--port", str(self.port),
            "--ready-file", str(ready),
            *self.extra_args,
        ]
        with log_path.open("ab") as log:
            self._proc = subprocess.Popen(
                cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True
            )
        deadline = time.monotonic() + self.start_timeout_s
        while not ready.exists():
            if self._proc.poll() is not None:
                tail = log_path.read_text(errors="replace").strip().splitlines()[-1:] or ["(no output)"]
                raise EngineError(f"embedded engine exited with code {self._proc.returncode}: {tail[0]}")
            if time.monotonic() > deadline:
                await self.stop()
                raise EngineTimeout(f"embedded engine not ready within {self.start_timeout_s:g} s (log: {log_path})")
            await asyncio.sleep(0.05)
        info = json.loads(ready.read_text())
        self._chunk = chunk_size
        self._handle = EngineHandle(
            url=info["url"],
            chunk_size=chunk_size,
            kind="pdexporter-sim",
            modelled=True,
            gpu=info.get("gpu"),
            version=info.get("version"),
            profile=self.profile,
            cuda_graphs=info.get("cuda_graphs"),
            iteration_log=log_path,
            log_path=log_path,
        )
        return self._handle

    async def stop(self) -> None:
        proc, self._proc, self._handle = self._proc, None, None
        if proc is not None and proc.poll() is None:
            try:
                os.killpg(proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            for _ in range(100):
                if proc.poll() is not None:
                    break
                await asyncio.sleep(0.05)
            else:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None
