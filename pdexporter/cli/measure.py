"""`pdexporter measure`: one (chunk size, D, P) point, Phase 1 + Phase 2 x reps, one record
(`pdexporter.measure.job`)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated

import typer

from pdexporter.cli._common import (
    DEFAULT_PROFILE,
    ApiKeyFileOpt,
    EngineCommandOpt,
    EngineOpt,
    GpuOpt,
    ModelOpt,
    ProfileOpt,
    ReadTimeoutOpt,
    TargetOpt,
    console,
    run_async,
    show,
)
from pdexporter.cli._vocab import B_FLAGS, D_FLAGS, P_FLAGS
from pdexporter.measure.point import DEFAULT_RETRIES


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
    engine_command: EngineCommandOpt = None,
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
    options = dict(locals())
    from pdexporter.measure.job import measure_job, record_sheet

    job = measure_job(**options)
    record = run_async(job.run(_bar, show), interrupted=job.interrupted)
    show(record_sheet(record))
    print(job.store.record_path(*record.key))


@contextmanager
def _bar(description: str, total: int) -> Iterator[Callable[[int], None]]:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
    from rich.progress import TimeRemainingColumn as Remaining

    with Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  Remaining(), console=console, refresh_per_second=2) as bar:
        task = bar.add_task(description, total=total)
        yield lambda done: bar.update(task, completed=done)
