"""Shared pieces of the fault-injection suite (docs/reliability.md): the misbehaving engine is
tests/scripted_engine.py's ScriptedEngine, a TEST DOUBLE (the embedded engine never fails on
purpose); `measure` and `sweep` run as the real CLI in a child process against it, `run` as the
real `Runner` in this process (so a test can read its registry and change the fault while it runs).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

from pdexporter.exporter.config import build_config
from pdexporter.exporter.runner import Runner
from pdexporter.launch import ExternalLauncher
from tests.helpers import cli_env
from tests.scripted_engine import ScriptedEngine

ROOT = Path(__file__).resolve().parents[3]
CADENCE_S = 0.01  # the double's decode step: 10 ms, steady whatever the machine's load does to sleeps
B, D, P = 2048, 2, 64
# Small probes: a 64-token shared prefix, 160 tokens each (room for steady state, the window, recovery).
PROTOCOL_ARGS = ("--decode-context-tokens", "64", "--decode-output-tokens", "160")


async def run_cli(*args: str, timeout: float = 180) -> tuple[int, str, str, float]:
    """The CLI in a child process: (exit code, stdout, stderr, seconds it took)."""
    t0 = time.monotonic()
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "pdexporter", *args, cwd=ROOT, env=cli_env(),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )
    try:
        out, err = await asyncio.wait_for(proc.communicate(), timeout)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        raise
    return proc.returncode or 0, out.decode(), err.decode(), time.monotonic() - t0


def error_line(stderr: str) -> str:
    """The one `pdexporter: error:` line of a failed command (and no traceback)."""
    lines = [line for line in stderr.splitlines() if line.startswith("pdexporter: error:")]
    assert len(lines) == 1 and "Traceback" not in stderr, stderr[-3000:]
    return lines[0]


async def measure(engine: ScriptedEngine, out: Path, *extra: str) -> tuple[int, str, float]:
    code, _, err, took = await run_cli("measure", "--target", engine.url, "--out", str(out), "-B", str(B),
                                       "-D", str(D), "-P", str(P), "--reps", "1", *PROTOCOL_ARGS, *extra)
    return code, err, took


def sweep_file(tmp_path: Path, **top: Any) -> Path:
    spec: dict[str, Any] = {
        "grid": {"chunk_sizes": [B], "decode_batch_sizes": [D], "new_prefill_tokens": [P]},
        "reps": 1, "retries": 2, "mode": "faithful", "cooldown": {"seconds": 0},
        "protocol": {"decode_context_tokens": 64, "decode_output_tokens": 160},
        "output": str(tmp_path / "results"), **top,
    }
    path = tmp_path / "sweep.yaml"
    path.write_text(json.dumps(spec))  # JSON is YAML
    return path


async def sweep(engine: ScriptedEngine, tmp_path: Path, *extra: str, **top: Any) -> tuple[int, str, float]:
    code, _, err, took = await run_cli("sweep", str(sweep_file(tmp_path, **top)), "--target", engine.url, *extra)
    return code, err, took


def record(out: Path) -> dict[str, Any]:
    return json.loads((out / str(B) / f"D{D}_P{P}.json").read_text())


def posts(engine: ScriptedEngine, role: str) -> int:
    """Completion requests the engine received of a role (prefill: max_tokens 1)."""
    return sum(1 for b in engine.bodies if (b.get("max_tokens") == 1) == (role == "prefill"))


# --- the live exporter ---------------------------------------------------------------------------

def value(runner: Runner, name: str, **labels: str) -> float:
    for family in runner.metrics.registry.collect():
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                return float(sample.value)
    return 0.0


def reason(runner: Runner) -> str:
    for family in runner.metrics.registry.collect():
        for sample in family.samples:
            if sample.name == "pdexporter_up_reason" and sample.value == 1:
                return sample.labels["reason"]
    return "?"


@contextlib.asynccontextmanager
async def live(url: str, *, log: Callable[[str], None] = lambda line: None, launcher_chunk: int | None = B,
               **fields: Any) -> AsyncIterator[tuple[Runner, asyncio.Task[None]]]:
    """A `Runner` against `url` (started, not necessarily ready), stopped and awaited at the end;
    its log lines to `log`. `launcher_chunk`: the chunk size the operator says (None: not said)."""
    settings = {
        "probe_streams": D,
        "chunk_size": B,
        "prefill_tokens": P,
        "inject_every_s": 0.3,
        "listen_host": "127.0.0.1",
        "listen_port": 0,
        "target": url,
        "scrape_interval_s": 0.3,
        "protocol": {"decode_context_tokens": 64, "decode_output_tokens": 160},
    }
    settings.update(fields)
    runner = Runner(build_config(**settings), ExternalLauncher(url, launcher_chunk), log=log)
    stop = asyncio.Event()
    task = asyncio.create_task(runner.run(stop))
    try:
        yield runner, task
    finally:
        stop.set()
        await asyncio.wait_for(task, 60)


# --- what really ran beside what (issue 31) --------------------------------------------------------

def most_beside(engine: ScriptedEngine, role: str) -> int:
    """The most streams the engine was running when a request of `role` arrived: a probe of a
    window (or of Phase 1) finds at most its D - 1 siblings, the injected prefill its D probes;
    more means a re-run ran beside a failed attempt's streams."""
    return max((n for r, n in engine.arrivals if r == role), default=0)


async def foreign_stream(url: str, tokens: int) -> None:
    """Another client's request on the engine (`tokens` tokens, read to its end, or cancelled)."""
    import aiohttp

    body = {"model": "scripted-model", "prompt": [1, 2, 3], "max_tokens": tokens, "stream": True}
    async with aiohttp.ClientSession() as session, session.post(f"{url}/v1/completions", json=body) as resp:
        async for _ in resp.content.iter_any():
            pass
