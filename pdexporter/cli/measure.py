"""`pdexporter measure`: one (chunk size, D, P) point, Phase 1 + Phase 2 x reps, one record."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.table import Table

from pdexporter._internal.text import plural
from pdexporter._internal.writable import check_writable
from pdexporter.cli._common import (
    DEFAULT_PROFILE,
    ApiKeyFileOpt,
    EngineOpt,
    GpuOpt,
    ModelOpt,
    ProfileOpt,
    ReadTimeoutOpt,
    TargetOpt,
    api_key,
    console,
    run_async,
)
from pdexporter.cli._vocab import B_FLAGS, D_FLAGS, P_FLAGS
from pdexporter.client.client import read_timeout_seconds
from pdexporter.engines import adapter
from pdexporter.errors import PdexporterError
from pdexporter.launch.choose import claimed_engine, make_launcher
from pdexporter.measure.driver import http_driver
from pdexporter.measure.point import DEFAULT_RETRIES, PointSpec, check_reps, check_retries, measure_point
from pdexporter.measure.protocol import ProtocolSettings, protocol_settings, warm_prefix, warm_shapes
from pdexporter.measure.records import RunRecord
from pdexporter.measure.store import ResultsStore

DEFAULT_CHUNK_SIZE = 8192  # the embedded engine's, when no -B is given


def register(app: typer.Typer) -> None:
    app.command("measure")(measure)


def measure(
    chunk_size: Annotated[int | None, typer.Option(
        *B_FLAGS, help="The engine's chunk size (tokens per step: vLLM's max_num_batched_tokens, SGLang's "
                       "chunked_prefill_size). Default: what the engine publishes (SGLang), else the engine's "
                       "default (8192), checked against every window.")] = None,
    decode_batch_size: Annotated[int, typer.Option(*D_FLAGS, help="Probe decode streams (D, requests).")] = 4,
    new_prefill_tokens: Annotated[int, typer.Option(*P_FLAGS, help="Tokens of the cold prefill (P).")] = 8192,
    reps: Annotated[int, typer.Option("--reps", min=1, help="Phase 2 repetitions.")] = 5,
    out: Annotated[Path, typer.Option("--out", help="Results directory.")] = Path("results"),
    target: TargetOpt = None,
    engine: EngineOpt = None,
    model: ModelOpt = None,
    gpu: GpuOpt = None,
    api_key_file: ApiKeyFileOpt = None,
    profile: ProfileOpt = DEFAULT_PROFILE,
    read_timeout: ReadTimeoutOpt = None,
    decode_context_tokens: Annotated[int, typer.Option(help="Shared probe prefix length (tokens).")] = 4096,
    decode_output_tokens: Annotated[int, typer.Option(help="Tokens each probe decodes.")] = 256,
    warmup: Annotated[bool, typer.Option("--warmup/--no-warmup", help="Warm the prefill shape first.")] = True,
    resume: Annotated[bool, typer.Option("--resume/--no-resume", help="Keep repetitions already recorded.")] = True,
    retries: Annotated[int, typer.Option(
        "--retries", help="Run Phase 1 or a repetition again this often after a transient failure (a 5xx, a "
        "stall, a connection lost, no steady state), with fresh probes.")] = DEFAULT_RETRIES,
) -> None:
    """Measure one interference point and write results/{chunk}/D{d}_P{p}.json."""
    claimed = claimed_engine(target, engine)
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
    settings = settings.with_read_timeout(read_timeout_s)
    token = api_key(api_key_file)
    store = ResultsStore(out)
    record = run_async(_measure(spec, settings, reps, store, target, model, gpu, token, profile, warmup, resume,
                                read_timeout_s, retries, engine, given),
                       interrupted=lambda: _interrupted(store, spec))
    _print_record(record, store.record_path(*record.key))


def _interrupted(store: ResultsStore, spec: PointSpec) -> str:
    """What Ctrl-C left behind: the repetitions recorded so far (the same command resumes)."""
    path = store.record_path(*spec.key)
    try:
        record = store.load_record(*spec.key)
    except PdexporterError:
        record = None
    done = len(record.reps) if record is not None else 0
    return (f"interrupted: {plural(done, 'repetition')} recorded in {path}"
            + ("; the same command resumes from there" if done else ""))


async def _measure(spec: PointSpec, settings: ProtocolSettings, reps: int, store: ResultsStore, target: str | None,
                   model: str | None, gpu: str | None, token: str | None, profile: str, warmup: bool,
                   resume: bool, read_timeout_s: float | None, retries: int = DEFAULT_RETRIES,
                   engine: str | None = None, given: bool = True) -> RunRecord:
    store.clean_stale()  # temporary files of a killed earlier run
    launcher = make_launcher(target, chunk_size=spec.chunk_size if given or not target else None, profile=profile,
                             gpu=gpu, log_dir=store.engine_dir(spec.chunk_size) if not target else None, engine=engine)
    try:
        handle = await launcher.start(spec.chunk_size)
        async with http_driver(handle, model=model, api_key=token, gpu=gpu, read_timeout_s=read_timeout_s) as driver:
            source = "given" if given or not target else "assumed"
            if driver.info.chunk_size_published:
                source = "published"
            if driver.info.chunk_size is not None and driver.info.chunk_size != spec.chunk_size:
                # the engine says its chunk size (SGLang's /server_info) and nobody gave one
                spec = PointSpec(driver.info.chunk_size, spec.decode_batch_size, spec.new_prefill_tokens).validate()
            spec.check_budget(driver.info.kind)
            driver.info.check_fits(spec, settings)
            if source == "assumed":
                console.print(f"--chunk-size not given: assuming {spec.chunk_size}, the {driver.info.kind} default (it "
                              "does not publish its own); every window checks it against the probes' cadence")
            if driver.info.modelled:
                console.print(f"[yellow]{driver.info.note}[/]")
            with Progress(
                TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                TimeElapsedColumn(), TimeRemainingColumn(), console=console, refresh_per_second=2,
            ) as bar:
                task = bar.add_task(f"B={spec.chunk_size} D={spec.decode_batch_size} P={spec.new_prefill_tokens}",
                                    total=reps)
                if warmup:
                    await warm_prefix(driver, settings)
                    await warm_shapes(driver, [spec.new_prefill_tokens], settings)
                return await measure_point(
                    driver, spec, settings, store, reps=reps, mode="faithful", resume=resume,
                    on_rep=lambda rep: bar.update(task, completed=rep.rep + 1), retries=retries,
                    on_retry=lambda what, exc: console.print(f"{what}: {exc}; running it again", highlight=False,
                                                             soft_wrap=True),
                    chunk_size_source=source,
                )
    finally:
        await launcher.stop()


def _fmt(value: float | int | None, unit: str = "") -> str:
    if value is None:
        return "-"
    return f"{value:.2f}{unit}" if isinstance(value, float) else f"{value}{unit}"


def _print_record(record: RunRecord, path: Path) -> None:
    c, b, i, d = record.config, record.baseline, record.interference, record.derived
    table = Table(title=f"B={c.chunk_size} D={c.decode_batch_size} P={c.new_prefill_tokens} "
                        f"({record.summary.reps_done if record.summary else 1} reps, median)")
    table.add_column("quantity")
    table.add_column("value", justify="right")
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
    console.print(table)
    if c.modelled:
        console.print(f"[yellow]{c.note}[/]")
    print(path)
