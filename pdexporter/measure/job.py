"""`pdexporter measure` as a job: one (chunk size, D, P) point on an engine (external, or the
embedded one), Phase 1 + Phase 2 x reps, one record (`measure_job`, then `MeasureJob.run`), and
the record told as a table (`record_sheet`)."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path

from pdexporter._internal.sheet import Plain, Sheet, Shown, columns
from pdexporter._internal.text import plural
from pdexporter._internal.writable import check_writable
from pdexporter.engines import adapter
from pdexporter.errors import PdexporterError
from pdexporter.launch.choose import claimed_engine, command_of, make_launcher
from pdexporter.measure.point import DEFAULT_RETRIES, PointSpec, check_reps, check_retries, measure_point
from pdexporter.measure.protocol import ProtocolSettings, protocol_settings, warm_prefix, warm_shapes
from pdexporter.measure.records import RunRecord
from pdexporter.measure.store import ResultsStore

__all__ = [
    "DEFAULT_CHUNK_SIZE", "Bar", "MeasureJob", "measure_job", "record_sheet",
]


DEFAULT_CHUNK_SIZE = 8192  # the embedded engine's, when no -B is given

# (description, total) -> a progress display, entered while the repetitions run, that takes the
# number of repetitions done
Bar = Callable[[str, int], AbstractContextManager[Callable[[int], None]]]


@dataclass
class MeasureJob:
    spec: PointSpec
    settings: ProtocolSettings
    reps: int
    store: ResultsStore
    target: str | None
    model: str | None
    gpu: str | None
    token: str | None
    profile: str
    warmup: bool
    resume: bool
    read_timeout_s: float | None
    retries: int
    engine: str | None
    given: bool
    engine_command: tuple[str, ...] | None = None  # how the --target engine was started (--engine-command)

    def interrupted(self) -> str:
        """What Ctrl-C left behind: the repetitions recorded so far (the same command resumes)."""
        path = self.store.record_path(*self.spec.key)
        try:
            record = self.store.load_record(*self.spec.key)
        except PdexporterError:
            record = None
        done = len(record.reps) if record is not None else 0
        return (f"interrupted: {plural(done, 'repetition')} recorded in {path}"
                + ("; the same command resumes from there" if done else ""))

    async def run(self, bar: Bar, note: Callable[[Shown], None]) -> RunRecord:
        """Start the engine, measure the point (resuming what the store holds), stop the engine."""
        from pdexporter.measure.driver import http_driver

        spec, settings, target = self.spec, self.settings, self.target
        self.store.clean_stale()  # temporary files of a killed earlier run
        self.store.save_window(settings.window_fields())  # what `reanalyse` re-derives these records with
        launcher = make_launcher(target, chunk_size=spec.chunk_size if self.given or not target else None,
                                 profile=self.profile, gpu=self.gpu,
                                 log_dir=self.store.engine_dir(spec.chunk_size) if not target else None,
                                 engine=self.engine, engine_command=self.engine_command)
        try:
            handle = await launcher.start(spec.chunk_size)
            async with http_driver(handle, model=self.model, api_key=self.token, gpu=self.gpu,
                                   read_timeout_s=self.read_timeout_s) as driver:
                source = "given" if self.given or not target else "assumed"
                if driver.info.chunk_size_published:
                    source = "published"
                if driver.info.chunk_size is not None and driver.info.chunk_size != spec.chunk_size:
                    # the engine says its chunk size (SGLang's /server_info) and nobody gave one
                    spec = PointSpec(driver.info.chunk_size, spec.decode_batch_size,
                                     spec.new_prefill_tokens).validate()
                spec.check_budget(driver.info.kind)
                driver.info.check_fits(spec, settings)
                if source == "assumed":
                    note(f"--chunk-size not given: assuming {spec.chunk_size}, the {driver.info.kind} default (it "
                         "does not publish its own); every window checks it against the probes' cadence")
                if driver.info.modelled:
                    note(f"[yellow]{driver.info.note}[/]")
                with bar(f"B={spec.chunk_size} D={spec.decode_batch_size} P={spec.new_prefill_tokens}",
                         self.reps) as done:
                    if self.warmup:
                        await warm_prefix(driver, settings)
                        await warm_shapes(driver, [spec.new_prefill_tokens], settings)
                    return await measure_point(
                        driver, spec, settings, self.store, reps=self.reps, mode="faithful", resume=self.resume,
                        on_rep=lambda rep: done(rep.rep + 1), retries=self.retries,
                        on_retry=lambda what, exc: note(Plain(f"{what}: {exc}; running it again")),
                        chunk_size_source=source,
                    )
        finally:
            await launcher.stop()


def measure_job(*, chunk_size: int | None, decode_batch_size: int, new_prefill_tokens: int, reps: int, out: Path,
                target: str | None, engine: str | None, model: str | None, gpu: str | None,
                api_key_file: Path | None, profile: str, read_timeout: str | None, decode_context_tokens: int,
                decode_output_tokens: int, warmup: bool = True, resume: bool = True,
                retries: int = DEFAULT_RETRIES, engine_command: str | None = None) -> MeasureJob:
    """The point and its settings checked before anything starts (one line naming the option). The chunk
    size, where not given, is what --engine-command starts the engine with, if it says."""
    from pdexporter.client.client import read_timeout_seconds, resolve_api_key

    claimed = claimed_engine(target, engine)
    words, said = command_of(target, engine_command, chunk_size, claimed)
    if chunk_size is None and said is not None:
        chunk_size = said[1]
    given = chunk_size is not None
    b = chunk_size if chunk_size is not None else (
        adapter(claimed).default_chunk_size if claimed is not None else DEFAULT_CHUNK_SIZE)
    spec = PointSpec(b, decode_batch_size, new_prefill_tokens).validate()
    if claimed is not None:
        spec.check_budget(claimed)
    check_reps(reps)
    check_retries(retries)
    check_writable(out)
    settings = protocol_settings(decode_context_tokens=decode_context_tokens, decode_output_tokens=decode_output_tokens)
    read_timeout_s = None if read_timeout is None else read_timeout_seconds(read_timeout)
    return MeasureJob(spec, settings.with_read_timeout(read_timeout_s), reps, ResultsStore(out), target, model, gpu,
                      resolve_api_key(api_key_file), profile, warmup, resume, read_timeout_s, retries, engine, given,
                      words)


def _fmt(value: float | int | None, unit: str = "") -> str:
    if value is None:
        return "-"
    return f"{value:.2f}{unit}" if isinstance(value, float) else f"{value}{unit}"


def record_sheet(record: RunRecord) -> list[Shown]:
    """The record's medians as a table (and its MODELLED note)."""
    c, b, i, d = record.config, record.baseline, record.interference, record.derived
    table = Sheet(f"B={c.chunk_size} D={c.decode_batch_size} P={c.new_prefill_tokens} "
                  f"({record.summary.reps_done if record.summary else 1} reps, median)",
                  columns("quantity", "value", justify="right", first="left"))
    rows = [
        ("TPOT baseline p50", _fmt(b.tpot_p50_ms, " ms")),
        ("TPOT during prefill p50", _fmt(i.tpot_during_prefill_p50_ms, " ms")),
        ("TPOT after prefill p50", _fmt(i.tpot_after_prefill_p50_ms, " ms")),
        ("TPOT penalty", _fmt(d.tpot_penalty_ms, " ms")),
        ("TPOT penalty p50", _fmt(d.tpot_penalty_p50_ms, " ms")),
        ("penalty ratio", _fmt(d.tpot_penalty_ratio)),
        ("prefill duration", _fmt(i.prefill_duration_ms, " ms")),
        ("chunks actual / expected", f"{_fmt(i.num_chunks_actual)} / {_fmt(i.num_chunks_expected)}"),
        ("chunks in engine log", _fmt(i.num_chunks_engine_log)),
        ("total interference per stream", _fmt(d.total_interference_ms, " ms")),
        ("CV of penalty over reps", _fmt(record.summary.cv_tpot_penalty if record.summary else None)),
        ("runs repeated after a fault", f"reps {sum(r.retries for r in record.reps)}, "
                                        f"Phase 1 {max((r.baseline_retries for r in record.reps), default=0)}"),
    ]
    for name, value in rows:
        table.add_row(name, value)
    return [table, *([f"[yellow]{c.note}[/]"] if c.modelled else [])]
