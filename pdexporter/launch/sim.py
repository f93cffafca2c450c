"""The embedded engine (`pdexporter sim serve`) in a child process, in real time, so probe timing
goes through real HTTP exactly as against vLLM.

The child is pdexporter's alone: it runs in its own process group (stopped as a group) and gets
SIGTERM from the kernel when its parent dies, SIGKILL included (`_internal.procs.die_with_parent`),
so a killed `measure`, `run` or real-clock `sweep` never leaves it listening.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from pdexporter._internal.atomic import open_private_log
from pdexporter._internal.procs import die_with_parent, process_start_ticks, same_process
from pdexporter._internal.redact import redact_argv, without_own_secrets
from pdexporter.engines import SIM_KINDS, adapter, sim_engine
from pdexporter.errors import EngineError, EngineTimeout
from pdexporter.launch.base import EngineHandle, terminate_group

__all__ = [
    "SCRATCH_PREFIX", "SimLauncher", "clean_stale_scratch",
]

SCRATCH_PREFIX = "pdexporter-sim-"
_SCRATCH_RE = re.compile(r"^pdexporter-sim-(?P<pid>\d+)-(?P<start>\d+|x)-[A-Za-z0-9_]+$")
LEGACY_SCRATCH_AGE_S = 3600.0


def _owner_tag() -> str:
    start = process_start_ticks(os.getpid())
    return f"{os.getpid()}-{'x' if start is None else start}"


def clean_stale_scratch(base: str | os.PathLike[str] | None = None, now_s: float | None = None) -> list[Path]:
    """Remove the scratch directories (`/tmp/pdexporter-sim-PID-START-XXXX`, the embedded engine's
    ready file and log) of owners that are gone: `kill -9` of `run` or `measure` left them (its
    TemporaryDirectory never got to clean up). Those of live owners stay, and so do other users';
    unnamed ones from before the owner was in the name go once an hour old."""
    root = Path(base or tempfile.gettempdir())
    removed: list[Path] = []
    try:
        entries = list(root.iterdir())
    except OSError:
        return removed
    for path in entries:
        if not path.name.startswith(SCRATCH_PREFIX):
            continue
        try:
            st = path.lstat()
        except OSError:
            continue
        if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid():
            continue
        match = _SCRATCH_RE.match(path.name)
        if match:
            start = match.group("start")
            stale = not same_process(int(match.group("pid")), None if start == "x" else int(start))
        else:
            stale = (time.time() if now_s is None else now_s) - st.st_mtime > LEGACY_SCRATCH_AGE_S
        if stale:
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
    return removed


@dataclass
class SimLauncher:
    """The embedded engine in a child process, on real time, serving the HTTP API of the engine it
    imitates (`engine`: "vllm", "sglang", "sglang-mixed"), started with that engine's chunk flags."""

    profile: str = "h200-qwen3-coder-30b-a3b"
    host: str = "127.0.0.1"
    port: int = 0
    extra_args: tuple[str, ...] = ()
    log_dir: Path | None = None
    start_timeout_s: float = 60.0
    name: str = "sim"
    kv_role: str | None = None  # one instance of a P/D pair, or the decode-bench arm (`sim serve --kv-role`)
    env: dict[str, str] = field(default_factory=dict)  # added to the child's environment (never written down)
    engine: str = "vllm"  # the engine it imitates (`sim serve --engine`)
    _proc: subprocess.Popen[bytes] | None = field(default=None, repr=False)
    _chunk: int | None = field(default=None, repr=False)
    _handle: EngineHandle | None = field(default=None, repr=False)
    _tmp: tempfile.TemporaryDirectory[str] | None = field(default=None, repr=False)

    @property
    def can_set_chunk_size(self) -> bool:
        return True

    def send_traces_to(self, endpoint: str, env: Mapping[str, str] | None = None) -> None:
        """The engine started next sends vLLM-shaped request spans to `endpoint` (`sim serve
        --otlp-traces-endpoint`), its OTLP exporter set up by `env` (a token, a certificate)."""
        self.env = {**self.env, **(env or {})}
        args = list(self.extra_args)
        if "--otlp-traces-endpoint" in args:
            i = args.index("--otlp-traces-endpoint")
            del args[i : i + 2]
        self.extra_args = (*args, "--otlp-traces-endpoint", endpoint)

    async def start(self, chunk_size: int) -> EngineHandle:
        if self._proc is not None and self._proc.poll() is None and self._chunk == chunk_size and self._handle:
            return self._handle
        await self.stop()
        if self.log_dir is None:
            clean_stale_scratch()
            self._tmp = tempfile.TemporaryDirectory(prefix=f"{SCRATCH_PREFIX}{_owner_tag()}-")
            log_dir = Path(self._tmp.name)
        else:
            log_dir = Path(self.log_dir)
            log_dir.mkdir(parents=True, exist_ok=True)
        stem = f"sim-{chunk_size}" + (f"-{self.kv_role}" if self.kv_role else "")
        ready = log_dir / f"{stem}.ready.json"
        ready.unlink(missing_ok=True)
        log_path = log_dir / f"{stem}.log"
        kind = SIM_KINDS[self.kv_role] if self.kv_role else sim_engine(self.engine)
        engine_args = [
            "--profile", self.profile,
            *(("--engine", self.engine.removesuffix("-mixed")) if self.engine != "vllm" else ()),
            *adapter(kind).chunk_size_flags(chunk_size),
            *(["--kv-role", self.kv_role] if self.kv_role else []),
        ]
        cmd = [
            sys.executable, "-m", "pdexporter", "sim", "serve", *engine_args,
            "--host", self.host, "--port", str(self.port),
            "--ready-file", str(ready),
            *self.extra_args,
        ]
        with open_private_log(log_path) as log:
            # preexec_fn only calls prctl in the child (die_with_parent): nothing a thread could hold
            self._proc = subprocess.Popen(
                cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
                env={**without_own_secrets(os.environ), **self.env},  # pdexporter's own secrets not passed
                preexec_fn=die_with_parent(signal.SIGTERM),  # noqa: PLW1509
            )
        deadline = time.monotonic() + self.start_timeout_s
        while not ready.exists():
            if self._proc.poll() is not None:
                tail = log_path.read_text(errors="replace").strip().splitlines()[-1:] or ["(no output)"]
                reason = tail[0].removeprefix("pdexporter: error: ")  # the child's own one-line error
                raise EngineError(f"embedded engine exited with code {self._proc.returncode}: {reason}")
            if time.monotonic() > deadline:
                await self.stop()
                raise EngineTimeout(f"embedded engine not ready within {self.start_timeout_s:g} s (log: {log_path})")
            await asyncio.sleep(0.05)
        info = json.loads(ready.read_text())
        self._chunk = chunk_size
        self._handle = EngineHandle(
            url=info["url"],
            chunk_size=chunk_size,
            kind=kind,
            modelled=True,
            gpu=info.get("gpu"),
            version=info.get("version"),
            profile=self.profile,
            cuda_graphs=info.get("cuda_graphs"),
            iteration_log=log_path,
            log_path=log_path,
            command=tuple(redact_argv(["pdexporter", "sim", "serve", *engine_args, *self.extra_args])),
        )
        return self._handle

    async def stop(self) -> None:
        proc, self._proc, self._handle = self._proc, None, None
        if proc is not None:
            await terminate_group(proc.pid, 5.0, proc)
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None
