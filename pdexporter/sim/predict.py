"""Predicted records: the measurement protocol run on the embedded engine in virtual time.

`predict_records` runs `measure.point.measure_point`, unchanged, on a `SimDriver` per chunk size
(one engine per chunk size, as a sweep restarts vLLM), sharing Phase 1 per (chunk, D), and returns
the records, which say they are modelled. `pdexporter sim calibrate` uses it to predict held-out
configurations; anything that wants a modelled table can.
"""

from __future__ import annotations

import tempfile
from collections import defaultdict
from collections.abc import Callable, Iterable
from pathlib import Path

from pdexporter._internal.vloop import run_virtual
from pdexporter.measure.point import PointSpec, measure_point
from pdexporter.measure.protocol import ProtocolSettings, run_baseline, warm_prefix
from pdexporter.measure.records import RunRecord
from pdexporter.measure.store import ResultsStore
from pdexporter.sim.driver import SimDriver
from pdexporter.sim.profile import Profile

Key = tuple[int, int, int]  # (chunk_size, decode_batch_size, new_prefill_tokens)


async def predict_records_async(
    profile: Profile,
    keys: Iterable[Key],
    settings: ProtocolSettings,
    store: ResultsStore,
    *,
    reps: int = 1,
    on_point: Callable[[RunRecord], None] | None = None,
) -> dict[Key, RunRecord]:
    by_chunk: dict[int, list[tuple[int, int]]] = defaultdict(list)
    for b, d, p in sorted(set(keys)):
        by_chunk[b].append((d, p))
    out: dict[Key, RunRecord] = {}
    for b, points in sorted(by_chunk.items()):
        async with SimDriver.create(profile=profile, chunk_size=b) as driver:
            await warm_prefix(driver, settings)
            baselines = {}
            for d, p in points:
                if d not in baselines:
                    baselines[d] = await run_baseline(driver, d, settings)
                record = await measure_point(driver, PointSpec(b, d, p), settings, store, reps=reps,
                                             baseline=baselines[d], resume=False)
                out[(b, d, p)] = record
                if on_point is not None:
                    on_point(record)
    return out


def predict_records(
    profile: Profile,
    keys: Iterable[Key],
    settings: ProtocolSettings | None = None,
    *,
    reps: int = 1,
    out: Path | None = None,
    on_point: Callable[[RunRecord], None] | None = None,
) -> dict[Key, RunRecord]:
    """Records for `keys`, predicted in virtual time (seconds for a whole grid)."""
    settings = settings or ProtocolSettings()
    if out is not None:
        return run_virtual(predict_records_async(profile, keys, settings, ResultsStore(out), reps=reps,
                                                 on_point=on_point))
    with tempfile.TemporaryDirectory(prefix="pdexporter-predict-") as tmp:
        return run_virtual(predict_records_async(profile, keys, settings, ResultsStore(tmp), reps=reps,
                                                 on_point=on_point))
