"""The exporter's probes stay in phase (issue 13's soak: windows stopped after minutes because the
probes' cycles had drifted apart until no moment had them all steady with room for a window).

Twelve probes on the embedded engine (real time, real HTTP), no injections, short cycles (~1 s):
sampled every 0.1 s over 10 cycles (at most 20 s), the probes still decoding must end within a few
tokens of each other. Before `timeline.aligned_max_tokens`, a probe restarted a step apart
from the others stalled them with its admission (the engine's modelled ~13 ms per request) and
the split grew every cycle: 12 probes sent together ended 66 ms apart after one cycle and were
spread over more than a third of the cycle within 15 s.
"""

from __future__ import annotations

import asyncio
import time

import numpy as np
import pytest

from pdexporter.exporter.config import build_config
from pdexporter.exporter.runner import Runner
from pdexporter.launch import SimLauncher

pytestmark = [pytest.mark.integration, pytest.mark.realtime]  # run alone (scripts/test.sh)

D, TOKENS = 12, 96
CYCLES = 10  # the split grew every cycle: 10 hold it ~0.7 s apart (a third of the cycle is ~0.3 s)


async def test_probes_end_together_cycle_after_cycle() -> None:
    config = build_config(probe_streams=D, chunk_size=8192, inject_every_s=None, listen_host="127.0.0.1",
                          listen_port=0, protocol={"decode_output_tokens": TOKENS, "after_intervals": 32,
                                                   "inject_at_tokens": 32})
    runner = Runner(config, SimLauncher())
    stop = asyncio.Event()
    task = asyncio.create_task(runner.run(stop))
    spreads: list[int] = []
    cycles = 0
    try:
        await asyncio.wait_for(runner.ready.wait(), 90)
        end = time.monotonic() + 20
        while time.monotonic() < end and cycles < CYCLES:
            await asyncio.sleep(0.1)
            runner.book.refresh()
            left = [(s.stream.max_tokens or TOKENS) - s.stream.n_tokens for s in runner.book.live_states()
                    if s.stream.t_sent_ns is not None and not s.stream.done]
            decoding = [n for n in left if 0 < n < TOKENS]  # admitted and not yet ended
            if len(decoding) >= 2:
                spreads.append(max(decoding) - min(decoding))
            cycles = int(runner.metrics.probe_streams_started._value.get()) // D  # type: ignore[attr-defined]
    finally:
        stop.set()
        await asyncio.wait_for(task, 60)
    assert cycles >= CYCLES, f"only {cycles} probe cycles in 20 s"
    spread = np.asarray(spreads)
    # In phase: the probes still decoding end within a few steps of each other, every cycle.
    assert np.percentile(spread, 95) <= 8 and spread.max() <= config.protocol.inject_at_tokens, (
        f"spread of tokens left p50 {np.median(spread):.0f}, p95 {np.percentile(spread, 95):.0f}, max {spread.max()}")
