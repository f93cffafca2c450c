"""Predicted records: the sweep run on the embedded engine in virtual time.

`predict_records` runs the sweep controller itself (`sweep.controller.SweepController`: one
engine per chunk size, Phase 1 once per (chunk, D), Phase 2 x reps through `run_window`), on the
in-process embedded engine with a virtual clock, for exactly the configurations asked for, and
returns their records, which say they are modelled. `mode="fast"` perturbs long-lived probes as
the sweep's fast mode does (the mode the H200 records were measured in, and several times
quicker to predict). No CV re-runs, no cooldowns and no shape warm-up (the model has no JIT):
the prediction of one configuration is one pass. `pdexporter sim calibrate` uses it to fit the
engine-loop costs and to predict held-out configurations; anything that wants a modelled table can.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Iterable
from pathlib import Path

from pdexporter._internal.vloop import run_virtual
from pdexporter.engines import DEFAULT_ENGINE
from pdexporter.launch.specs import SimLauncherSpec
from pdexporter.measure.protocol import ProtocolSettings
from pdexporter.measure.records import RunRecord
from pdexporter.measure.store import ResultsStore
from pdexporter.sim.profile import Profile
from pdexporter.sweep.controller import SweepController, SweepObserver
from pdexporter.sweep.plan import ConfigStatus
from pdexporter.sweep.providers import VirtualSimProvider
from pdexporter.sweep.spec import CvSpec, GridSpec, SweepSpec, WarmupSpec

__all__ = [
    "Key", "predict_records", "predict_records_async",
]

Key = tuple[int, int, int]  # (chunk_size, decode_batch_size, new_prefill_tokens)


class _OnPoint(SweepObserver):
    def __init__(self, on_point: Callable[[RunRecord], None] | None) -> None:
        self.on_point = on_point

    def on_config(self, key: Key, record: RunRecord | None, status: ConfigStatus) -> None:
        if record is not None and self.on_point is not None:
            self.on_point(record)


async def predict_records_async(
    profile: Profile,
    keys: Iterable[Key],
    settings: ProtocolSettings,
    store: ResultsStore,
    *,
    reps: int = 1,
    mode: str = "faithful",
    on_point: Callable[[RunRecord], None] | None = None,
    imitates: str = DEFAULT_ENGINE,
) -> dict[Key, RunRecord]:
    if mode not in ("faithful", "fast"):
        raise ValueError(f"mode {mode!r}: expected 'faithful' or 'fast'")
    points = sorted(set(keys))
    if not points:
        return {}
    spec = SweepSpec(
        name="predict",
        grid=GridSpec(
            chunk_sizes=sorted({b for b, _, _ in points}),
            decode_batch_sizes=sorted({d for _, d, _ in points}),
            new_prefill_tokens=sorted({p for _, _, p in points}),
        ),
        reps=reps, mode=mode, protocol=settings, warmup=WarmupSpec(prefix=True, shapes=False),
        cv=CvSpec(max_reruns=0), cooldown={"seconds": 0},
        launcher=SimLauncherSpec.model_validate({"kind": "sim", "profile": profile.name, "engine": imitates}),
        output=str(store.root),
    )
    controller = SweepController(spec, store, VirtualSimProvider(profile, imitates=imitates),
                                 observer=_OnPoint(on_point), points=points, write_state=False)
    await controller.run()
    out: dict[Key, RunRecord] = {}
    for key in points:
        record = store.load_record(*key)
        if record is not None:
            out[key] = record
    return out


def predict_records(
    profile: Profile,
    keys: Iterable[Key],
    settings: ProtocolSettings | None = None,
    *,
    reps: int = 1,
    mode: str = "faithful",
    out: Path | None = None,
    on_point: Callable[[RunRecord], None] | None = None,
    imitates: str = DEFAULT_ENGINE,
) -> dict[Key, RunRecord]:
    """Records for `keys`, predicted in virtual time (seconds for a whole grid) on the embedded
    engine imitating `imitates` (`engines.IMITATED`)."""
    settings = settings or ProtocolSettings()
    if out is not None:
        return run_virtual(predict_records_async(profile, keys, settings, ResultsStore(out), reps=reps, mode=mode,
                                                 on_point=on_point, imitates=imitates))
    with tempfile.TemporaryDirectory(prefix="pdexporter-predict-") as tmp:
        return run_virtual(predict_records_async(profile, keys, settings, ResultsStore(tmp), reps=reps, mode=mode,
                                                 on_point=on_point, imitates=imitates))
