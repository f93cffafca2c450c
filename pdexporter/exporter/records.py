"""The exporter's windows on disk (`pdexporter run --out DIR`): each window is the next repetition
of `DIR/{B}/D{N}_P{P}.json`, written like `measure`'s (raw timestamps, then the record, both
atomic), in a directory that must not hold a record measured another way."""

from __future__ import annotations

from pdexporter._internal.dirlock import hold_directory
from pdexporter.exporter.config import ExporterConfig
from pdexporter.measure.driver import EngineInfo
from pdexporter.measure.point import (
    PointSpec,
    append_rep,
    check_resumable,
    record_config,
    rep_record,
    resumable_reps,
)
from pdexporter.measure.protocol import InterferenceRun
from pdexporter.measure.records import RepRecord, aggregate
from pdexporter.measure.store import ResultsStore

__all__ = ["LiveRecords"]


class LiveRecords:
    def __init__(self, config: ExporterConfig, spec: PointSpec) -> None:
        self.config, self.spec = config, spec
        self.store = ResultsStore(config.out) if config.out else None

    def check_out_dir(self) -> None:
        """Fail before anything starts if another process writes into --out (`hold_directory`) or
        it holds a record measured another way, or keeps other window settings (`window.json`); remove the
        temporary files of writers that died (`ResultsStore.clean_stale`). Passive mode's records are its own
        (`exporter.passive_live`)."""
        if self.store is not None:
            hold_directory(self.store.root)
            self.store.save_window(self.config.protocol.window_fields())  # what `reanalyse` re-derives them with
        if self.store is not None and not self.config.passive:
            key = self.spec.key
            self.store.clean_stale()
            check_resumable(self.store.load_record(*key), {"mode": "live", **self.config.protocol.record_fields()},
                            str(self.store.record_path(*key)))

    def save(self, run: InterferenceRun, started_at: str, index: int,
             info: EngineInfo | None) -> tuple[str | None, RepRecord]:
        """The window's repetition record, and where it was written (None without --out)."""
        if self.store is None or info is None:
            return None, rep_record(index, run, self.spec, raw=None, started_at=started_at)
        key = self.spec.key
        config = record_config(self.spec, info, self.config.protocol, reps=1, mode="live",
                               chunk_size_source=self.config.chunk_size_source)
        done = resumable_reps(self.store.load_record(*key), config, str(self.store.record_path(*key)))
        append_rep(self.store, self.spec, config, done, run, started_at,
                   lambda c, reps: aggregate(c.model_copy(update={"reps_planned": len(reps)}), reps))
        return str(self.store.record_path(*key)), done[-1]
