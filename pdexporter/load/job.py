"""`pdexporter load` as a job: the options checked and the schedule drawn (`load_job`), the requests
sent to the engine until the schedule ends or SIGTERM/SIGINT (`LoadJob.run`), and the summary
(written as JSON with `out`)."""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pdexporter._internal.redact import redact_url
from pdexporter._internal.urls import check_http_url
from pdexporter.errors import ConfigError
from pdexporter.load.mix import MIXES, LoadRequest, LoadSpec, schedule

__all__ = [
    "LoadJob", "load_job", "summary_line",
]


@dataclass
class LoadJob:
    target: str
    requests: list[LoadRequest]
    rate: float
    seconds: float
    seed: int
    mix: str
    model: str | None
    token: str | None
    out: Path | None

    @property
    def announce(self) -> str:
        return (f"pdexporter load: {len(self.requests)} requests over {self.seconds:g} s at {self.rate:g}/s to "
                f"{redact_url(self.target)}")

    async def run(self, on_sent: Callable[[float, Any], None]) -> dict[str, Any]:
        """Send the schedule (`on_sent(seconds since the start, drive's result so far)` after each),
        drain for up to a minute, and return the summary (written to `out` when given)."""
        from pdexporter._internal.atomic import atomic_write_json
        from pdexporter.launch import EngineHandle
        from pdexporter.load.drive import drive
        from pdexporter.measure.driver import http_driver

        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        started = time.monotonic()
        async with http_driver(EngineHandle(url=self.target.rstrip("/"), chunk_size=None), model=self.model,
                               api_key=self.token) as driver:
            result = await drive(driver, self.requests, stop=stop, drain_s=60.0,
                                 on_sent=lambda sent: on_sent(time.monotonic() - started, sent))
        summary = {"sent": result.sent, "finished": result.finished, "failed": result.failed,
                   "prompt_tokens": result.prompt_tokens, "output_tokens": result.output_tokens,
                   "late_s": round(result.late_s, 4), "open_at_end": len(result.open), "rate": self.rate,
                   "duration_s": self.seconds, "seed": self.seed, "mix": self.mix, "target": redact_url(self.target)}
        if self.out is not None:
            atomic_write_json(self.out, summary)
        return summary


def load_job(*, target: str | None, rate: float, duration: str, seed: int, mix: str, model: str | None,
             api_key_file: Path | None, out: Path | None) -> LoadJob:
    """The options checked (one line naming the option) and the schedule drawn."""
    from pdexporter._internal.durations import parse_duration
    from pdexporter._internal.writable import check_writable
    from pdexporter.client.client import resolve_api_key

    if target is None:
        raise ConfigError("--target: required (the engine's http:// or https:// URL)")
    check_http_url(target, "--target")
    if out is not None:
        check_writable(out, directory=False)
    if mix not in MIXES:
        raise ConfigError(f"--mix {mix!r}: expected one of {', '.join(MIXES)}")
    seconds = parse_duration(duration, "--duration")
    try:
        spec = LoadSpec(rate=rate, duration_s=seconds, seed=seed, mix=MIXES[mix])
    except ValueError as exc:
        raise ConfigError(f"--rate {rate:g} / --duration {duration}: {exc}") from None
    return LoadJob(target, schedule(spec), rate, seconds, seed, mix, model, resolve_api_key(api_key_file), out)


def summary_line(summary: dict[str, Any]) -> str:
    return (f"sent {summary['sent']}, finished {summary['finished']}, failed {summary['failed']}, "
            f"{summary['prompt_tokens']} prompt tokens, worst send lag {summary['late_s']:.3f} s")
