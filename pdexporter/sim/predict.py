"""Predicted records: the measurement protocol run on the embedded engine in virtual time.

`predict_records` runs `measure.point.measure_point`, unchanged, on a `SimDriver` per chunk size
(one engine per chunk size, as a sweep restarts vLLM), sharing Phase 1 per (chunk, D), and returns
the records, which say they are modelled. In `mode="fast"` the repetitions of a (chunk, D) perturb
one set of long-lived probes, as the sweep's fast mode does (`sweep.fast.ProbePool`, 512 tokens of
context drift allowed): the mode the H200 records were measured in, and several times quicker to
predict than fresh 256-token probes per repetition. `pdexporter sim calibrate` uses it to fit the
engine-loop costs and to predict held-out configurations; anything that wants a modelled table can.
"""

from __future__ import annotations

import tempfile
from collections import defaultdict
from collections.abc import Awaitable, Callable, Iterable
from pathlib import Path

from pdexporter._internal.vloop import run_virtual
from pdexporter.measure.point import PointSpec, measure_point
from pdexporter.measure.protocol import BaselineRun, InterferenceRun, ProtocolSettings, run_baseline, warm_prefix
from pdexporter.measure.records import RunRecord
from pdexporter.measure.store import ResultsStore
from pdexporter.sim.driver import SimDriver
from pdexporter.sim.profile import Profile
from pdexporter.sweep.fast import ProbePool
from pdexporter.sweep.spec import injection_tokens

Key = tuple[int, int, int]  # (chunk_size, decode_batch_size, new_prefill_tokens)
FAST_DRIFT_TOKENS = 512  # sweeps/h200.yaml: fast.max_context_drift_tokens


async def predict_records_async(
    profile: Profile,
    keys: Iterable[Key],
    settings: ProtocolSettings,
    store: ResultsStore,
    *,
    reps: int = 1,
    mode: str = "faithful",
    on_point: Callable[[RunRecord], None] | None = None,
) -> dict[Key, RunRecord]:
    if mode not in ("faithful", "fast"):
        raise ValueError(f"mode {mode!r}: expected 'faithful' or 'fast'")
    by_chunk: dict[int, dict[int, list[int]]] = defaultdict(lambda: defaultdict(list))
    for b, d, p in sorted(set(keys)):
        by_chunk[b][d].append(p)
    out: dict[Key, RunRecord] = {}
    for b, by_d in sorted(by_chunk.items()):
        async with SimDriver.create(profile=profile, chunk_size=b) as driver:
            await warm_prefix(driver, settings)
            for d, prefills in sorted(by_d.items()):
                baseline = await run_baseline(driver, d, settings)
                pool = None
                if mode == "fast":
                    largest = max(injection_tokens(settings, b, d, p) for p in prefills)
                    pool = ProbePool(driver, b, d, settings, settings.inject_at_tokens + max(FAST_DRIFT_TOKENS, largest))
                    pool.plan([p for p in prefills for _ in range(reps)])
                for p in prefills:
                    record = await measure_point(driver, PointSpec(b, d, p), settings, store, reps=reps, mode=mode,
                                                 baseline=baseline, resume=False, interfere=_perturb(pool, p))
                    out[(b, d, p)] = record
                    if on_point is not None:
                        on_point(record)
                if pool is not None:
                    await pool.drain()
    return out


def _perturb(pool: ProbePool | None, p: int) -> Callable[[int, BaselineRun], Awaitable[InterferenceRun]] | None:
    """measure_point's Phase 2 in fast mode: the pool's probes perturbed by a P-token prefill."""
    if pool is None:
        return None

    def interfere(rep: int, base: BaselineRun) -> Awaitable[InterferenceRun]:
        return pool.interfere(p, base.stats)

    return interfere


def predict_records(
    profile: Profile,
    keys: Iterable[Key],
    settings: ProtocolSettings | None = None,
    *,
    reps: int = 1,
    mode: str = "faithful",
    out: Path | None = None,
    on_point: Callable[[RunRecord], None] | None = None,
) -> dict[Key, RunRecord]:
    """Records for `keys`, predicted in virtual time (seconds for a whole grid)."""
    settings = settings or ProtocolSettings()
    if out is not None:
        return run_virtual(predict_records_async(profile, keys, settings, ResultsStore(out), reps=reps, mode=mode,
                                                 on_point=on_point))
    with tempfile.TemporaryDirectory(prefix="pdexporter-predict-") as tmp:
        return run_virtual(predict_records_async(profile, keys, settings, ResultsStore(tmp), reps=reps, mode=mode,
                                                 on_point=on_point))
