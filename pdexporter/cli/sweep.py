"""`pdexporter sweep SWEEP.yaml`: the grid of a sweep file (`pdexporter.sweep.job`; `pdexporter sim
sweep` is its prediction on the embedded engine). Exit codes: `cli._sweeping`."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated

import typer

from pdexporter._internal.writable import check_writable
from pdexporter.cli._common import ApiKeyFileOpt, EngineCommandOpt, ReadTimeoutOpt, api_key, duration_option, seconds
from pdexporter.cli._sweeping import ChunkIndexOpt, DeadlineOpt, ModeOpt, RepsOpt, SweepFileArg, sweep_and_report
from pdexporter.cli._vocab import B_FLAGS
from pdexporter.measure.store import ResultsStore


def register(app: typer.Typer) -> None:
    app.command("sweep")(sweep)


def sweep(
    sweep_file: SweepFileArg,
    out: Annotated[Path | None, typer.Option("--out", help="Results directory (default: the file's `output`).")
                   ] = None,
    mode: ModeOpt = None,
    reps: RepsOpt = None,
    cooldown: Annotated[str | None, duration_option(
        "--cooldown", "Faithful mode's wait after each run (default: the file's cooldown.seconds)")] = None,
    deadline: DeadlineOpt = None,
    listen: Annotated[str | None, typer.Option(
        "--listen", help="HOST:PORT: export each window's gauges on /metrics while sweeping.")] = None,
    keep_engine: Annotated[bool, typer.Option(
        "--keep-engine", help="Leave the last engine running (local launcher) for a later run.")] = False,
    clock: Annotated[str | None, typer.Option(
        "--clock", help="Embedded engine only: virtual | real (default: the file's).")] = None,
    target: Annotated[str | None, typer.Option(
        "--target", help="Measure an engine already running at this URL (external launcher).")] = None,
    chunk_size: Annotated[int | None, typer.Option(
        *B_FLAGS, min=1, help="With --target: the engine's max_num_batched_tokens (tokens per step); the grid runs "
        "at this chunk size only (default: the grid's, when it has one).")] = None,
    engine_command: EngineCommandOpt = None,
    api_key_file: ApiKeyFileOpt = None,
    chunk_index: ChunkIndexOpt = None,
    read_timeout: ReadTimeoutOpt = None,
) -> None:
    """Run the grid of a sweep file: engine per chunk size, warm-up, Phase 1, Phase 2 x reps; resumable."""
    from pdexporter.sweep.job import sweep_spec

    started = time.monotonic()
    deadline_s = None if deadline is None else seconds(deadline, "--deadline", positive=True)
    spec = sweep_spec(sweep_file, mode=mode, reps=reps, cooldown=cooldown, listen=listen, clock=clock, target=target,
                      chunk_size=chunk_size, chunk_index=chunk_index, read_timeout=read_timeout,
                      engine_command=engine_command)
    store = ResultsStore(check_writable(out or Path(spec.output), "--out" if out else f"{sweep_file}: output"))
    sweep_and_report(spec, store, deadline=None if deadline_s is None else started + deadline_s,
                     keep_engine=keep_engine, token=api_key(api_key_file))
