"""From "the metrics server listens" to "the probes run": wait for the engine, for as long as told.

A sidecar beside a vLLM that loads for 20 minutes must not crash-loop. So `pdexporter run`
serves `/metrics` first, then tries to start its probe thread (`ProbeLoop`: the engine's /health,
/v1/models, the warm-up requests, the probes); when that fails because of the engine (refused,
reset during the warm-up, an HTTP error, a timeout, a broken answer), it exports `pdexporter_up
0` with the reason (`exporter.status`), waits with an exponential back-off (0.5 s doubling to
30 s) and starts again, forever by default or until `--engine-wait` has passed (then it exits
with the last error, one line, exit code 3). A `ConfigError` is not waited out: a model the engine
does not serve or a prefill longer than its max_model_len is a wrong setting, said once, exit 2.

Once the probes run, an engine that goes away is the probe thread's business: each probe is
restarted with its own back-off, and `pdexporter_up` is 0 with the reason until tokens flow again.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass

from pdexporter._internal.bounds import MAX_SECONDS
from pdexporter._internal.durations import parse_duration
from pdexporter.errors import ConfigError, EngineError, PdexporterError
from pdexporter.exporter.config import ExporterConfig
from pdexporter.exporter.metrics import ExporterMetrics, error_kind, set_up
from pdexporter.exporter.probes import ProbeLoop
from pdexporter.exporter.status import reason_of
from pdexporter.launch import EngineHandle
from pdexporter.measure.driver import EngineInfo
from pdexporter.measure.point import PointSpec

__all__ = ["EngineWait", "WaitReport", "exporter_probes", "parse_engine_wait", "start_probes"]


@dataclass(frozen=True)
class EngineWait:
    """How long `start_probes` keeps trying (`limit_s` None: forever), and its back-off."""

    limit_s: float | None = None
    first_backoff_s: float = 0.5
    max_backoff_s: float = 30.0

    def backoffs(self) -> list[float]:
        """The first few waits between attempts (then `max_backoff_s` for ever)."""
        out, wait = [], self.first_backoff_s
        while wait < self.max_backoff_s:
            out.append(wait)
            wait *= 2
        return [*out, self.max_backoff_s]


def exporter_probes(config: ExporterConfig, handle: EngineHandle, api_key: str | None, spec: PointSpec) -> ProbeLoop:
    """The exporter's probe loop, as its options ask (one for each start-up attempt)."""
    return ProbeLoop(handle, config.probe_streams, config.protocol, model=config.model, api_key=api_key,
                     warm_prefill_tokens=config.prefill_tokens if config.injecting else None,
                     stamp_at_wakeup=config.arrival_stamp != "read",
                     rx_stamps=None if config.arrival_stamp == "kernel-rx" else False,
                     stagger=config.passive, read_timeout_s=config.read_timeout_s,
                     check=lambda info: info.check_fits(spec, config.protocol, "--new-prefill-tokens"))


class WaitReport:
    """`start_probes`'s `on_wait` for the exporter: up 0 with the reason, the error counted, a log
    line when the reason changes."""

    def __init__(self, metrics: ExporterMetrics, log: Callable[[str], None]) -> None:
        self.metrics, self.log = metrics, log
        self.reason: str | None = None

    def __call__(self, reason: str, error: BaseException) -> None:
        set_up(self.metrics, reason)
        self.metrics.errors.labels(kind=error_kind(error)).inc()
        if reason != self.reason:
            self.log(f"waiting for the engine ({reason}): {error}")
            self.reason = reason


def parse_engine_wait(text: str, option: str = "--engine-wait") -> float | None:
    """`forever` (None) or a duration in (0, one week]."""
    if text.strip().lower() in ("forever", "inf", "infinite"):
        return None
    seconds = parse_duration(text, option)
    if not 0 < seconds <= MAX_SECONDS:
        raise ConfigError(f"{option} {text!r}: must be 'forever' or a duration > 0 and at most one week")
    return seconds


async def start_probes(
    make: Callable[[], ProbeLoop],
    wait: EngineWait,
    *,
    stop: asyncio.Event,
    on_wait: Callable[[str, BaseException], None],
    started_timeout_s: float,
) -> tuple[ProbeLoop, EngineInfo] | None:
    """A started probe loop and the engine's info; None when `stop` was set while waiting.
    `on_wait(reason, error)` is called before every wait (the runner exports it and logs it)."""
    t0 = time.monotonic()
    waits = wait.backoffs()
    attempt = 0
    while True:
        probes = make()
        try:
            info = await probes.wait_started(timeout_s=started_timeout_s)
            return probes, info
        except ConfigError:
            await asyncio.to_thread(probes.stop)
            raise
        except (PdexporterError, TimeoutError) as exc:
            await asyncio.to_thread(probes.stop)
            error = exc if isinstance(exc, PdexporterError) else EngineError(
                f"the engine did not get through the start-up (health, models, warm-up) within {started_timeout_s:g} s")
        delay = waits[min(attempt, len(waits) - 1)]
        attempt += 1
        if wait.limit_s is not None and time.monotonic() + delay - t0 > wait.limit_s:
            raise EngineError(f"engine not ready after {wait.limit_s:g} s (--engine-wait): {error}") from error
        on_wait(reason_of(error), error)
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(delay):
                await stop.wait()
        if stop.is_set():
            return None
