"""Where a sweep's Phase 2 time goes, per repetition: a timing harness for the benchmarks.

`PhaseTimer` wraps the protocol's steps (probe set ready, /metrics scrapes, settle, the window
maths, result files) for the duration of a `with` block and adds up, on the event loop's clock
(virtual time on the embedded engine's virtual clock, real time otherwise) and on the machine's,
how long each took (summed over engine slots when several run side by side). What is left of
`run_window` is the prefill in flight plus the recovery intervals, which the protocol defines;
what is outside `run_window` is bookkeeping between runs.
It patches methods of pdexporter's own classes while active and restores them after; nothing of
it is used outside tests/benchmarks.
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections import defaultdict
from contextlib import ExitStack, contextmanager
from typing import Any

from pdexporter.measure import point, probesets, protocol
from pdexporter.measure.driver import HttpDriver
from pdexporter.measure.sim_driver import SimDriver
from pdexporter.measure.store import ResultsStore
from pdexporter.sweep import controller

STEPS = ("ready", "scrape", "settle", "analysis", "window", "io", "retire", "phase1")


class PhaseTimer:
    def __init__(self) -> None:
        self.loop_s: dict[str, float] = defaultdict(float)
        self.wall_s: dict[str, float] = defaultdict(float)
        self.calls: dict[str, int] = defaultdict(int)
        # (loop, wall) at the end of each engine slot's last window (slots run as their own tasks)
        self._last_end: dict[object, tuple[float, float] | None] = {}

    def _add(self, step: str, loop_s: float, wall_s: float) -> None:
        self.loop_s[step] += loop_s
        self.wall_s[step] += wall_s
        self.calls[step] += 1

    def _wrap_async(self, step: str, fn: Any) -> Any:
        @functools.wraps(fn)
        async def wrapped(*args: Any, **kwargs: Any) -> Any:
            loop = asyncio.get_running_loop()
            slot = asyncio.current_task()
            t_loop, t_wall = loop.time(), time.perf_counter()
            last = self._last_end.get(slot)
            if step == "window" and last is not None:
                # from the end of this slot's last window to this one: bookkeeping
                self._add("between", t_loop - last[0], t_wall - last[1])
            try:
                return await fn(*args, **kwargs)
            finally:
                self._add(step, loop.time() - t_loop, time.perf_counter() - t_wall)
                # a window's end starts the next gap; Phase 1, warm-up and engine starts end it
                self._last_end[slot] = (loop.time(), time.perf_counter()) if step == "window" else None
        return wrapped

    def _wrap_sync(self, step: str, fn: Any) -> Any:
        @functools.wraps(fn)
        def wrapped(*args: Any, **kwargs: Any) -> Any:
            t_wall = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self._add(step, 0.0, time.perf_counter() - t_wall)
        return wrapped

    @contextmanager
    def active(self):  # type: ignore[no-untyped-def]
        patches: list[tuple[Any, str, Any, bool]] = [
            (probesets.PooledProbes, "ready", "ready", True),
            (probesets.FreshProbes, "ready", "ready", True),
            (probesets.PooledProbes, "settle", "settle", True),
            (probesets.FreshProbes, "settle", "settle", True),
            (probesets.PooledProbes, "retire", "retire", True),
            (HttpDriver, "scrape_metrics", "scrape", True),
            (SimDriver, "scrape_metrics", "scrape", True),
            (protocol, "analyse_traces", "analysis", False),
            (controller, "run_window", "window", True),
            (controller, "run_baseline", "phase1", True),  # before issue 31; since, Phase 1 goes through
            (point, "run_baseline", "phase1", True),  # `point.phase1`, which counts its re-runs
            (ResultsStore, "save_raw", "io", False),
            (ResultsStore, "save_record", "io", False),
            (ResultsStore, "load_record", "io", False),
            (controller.SweepController, "_warm", "warmup", True),
            (controller.SweepController, "_retire", "retire-end", True),
        ]
        with ExitStack() as stack:
            for owner, name, step, is_async in patches:
                original = getattr(owner, name, None)
                if original is None:
                    continue  # an older pdexporter (the "before" of a comparison) lacks it
                setattr(owner, name, (self._wrap_async if is_async else self._wrap_sync)(step, original))
                stack.callback(setattr, owner, name, original)
            yield self

    def lines(self, reps: int) -> list[str]:
        """Per repetition: each step, prefill + recovery (the window minus its steps), bookkeeping."""
        loop_in = self.loop_s["ready"] + self.loop_s["scrape"] + self.loop_s["settle"] + self.loop_s["analysis"]
        wall_in = self.wall_s["ready"] + self.wall_s["scrape"] + self.wall_s["settle"] + self.wall_s["analysis"]
        rows = [
            ("probe set ready (set starts, steady-state waits)", self.loop_s["ready"], self.wall_s["ready"]),
            ("retiring used probe sets (also at D ends)", self.loop_s["retire"], self.wall_s["retire"]),
            ("/metrics scrapes (2 per window)", self.loop_s["scrape"], self.wall_s["scrape"]),
            ("settle (a fresh token after the scrape)", self.loop_s["settle"], self.wall_s["settle"]),
            ("window maths", self.loop_s["analysis"], self.wall_s["analysis"]),
            ("prefill in flight + recovery intervals", self.loop_s["window"] - loop_in,
             self.wall_s["window"] - wall_in),
            ("between windows (records, raw files, plans)", self.loop_s["between"], self.wall_s["between"]),
            ("record/raw file reads and writes (all)", self.loop_s["io"], self.wall_s["io"]),
        ]
        n = max(reps, 1)
        return [f"    {name:48s} {a / n * 1e3:8.1f} ms {b / n * 1e3:8.1f} ms" for name, a, b in rows]
