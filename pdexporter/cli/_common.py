"""Options and plumbing shared by the commands (target selection, async entry, output)."""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import Callable, Coroutine, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer
from rich.console import Console, ConsoleRenderable, RenderHook
from rich.table import Table
from rich.text import Text

from pdexporter._internal.durations import parse_duration
from pdexporter._internal.redact import redact
from pdexporter._internal.sheet import Plain, Sheet, Shown
from pdexporter.cli._vocab import DURATION, DURATION_SYNTAX
from pdexporter.errors import ConfigError, Interrupted

T = TypeVar("T")

DEFAULT_PROFILE = "h200-qwen3-coder-30b-a3b"

# Where no terminal says how wide it is (a pipe, a log, CI), rich lays everything out on 80 columns:
# tables were cut ("aggregate_interferen…") and lines wrapped mid-figure. There a console is this
# wide, so that every line comes out whole; $COLUMNS, when set, still wins.
UNBOUNDED_WIDTH = 1000


def make_console(*, stderr: bool = False) -> Console:
    """The one way a command makes a rich console (for stdout, or stderr where `stderr`): a
    terminal's own width on a terminal, $COLUMNS where set, else `UNBOUNDED_WIDTH`."""
    made = Console(stderr=stderr)
    if not made.is_terminal and not os.environ.get("COLUMNS", "").strip().isdigit():
        made.width = UNBOUNDED_WIDTH
    return made


console = make_console(stderr=True)  # progress, notes and tables; stdout carries the result


class RedactHook(RenderHook):
    """Hides the secrets the process holds (`_internal.redact`) in what a console prints, before
    rich wraps it into lines (a secret cut in two by a line break would pass the stream's check)."""

    def process_renderables(self, renderables: list[ConsoleRenderable]) -> list[ConsoleRenderable]:
        out: list[ConsoleRenderable] = []
        for item in renderables:
            if isinstance(item, Text) and (hidden := redact(item.plain)) != item.plain:
                item = Text(hidden, style=item.style, end=item.end)
            out.append(item)
        return out


console.push_render_hook(RedactHook())


@contextmanager
def progress_bar(total: int, description: str) -> Iterator[Callable[[str], None]]:
    """A bar with ETA while the job runs; transient, so an error stays the only line and the summary
    printed afterwards is what remains on the screen."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
    from rich.progress import TimeRemainingColumn as Remaining

    with Progress(
        TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.fields[step]}"),
        TimeElapsedColumn(), Remaining(), console=console, refresh_per_second=4, transient=True,
    ) as bar:
        task = bar.add_task(description, total=total, step="")

        def tick(step: str) -> None:
            bar.update(task, advance=1, step=step)

        yield tick
        bar.update(task, completed=total, step="done")


def table_of(sheet: Sheet) -> Table:
    """A library's `Sheet` as a rich table."""
    from rich import box

    style: dict[str, Any] = {
        "compact": {"box": box.SIMPLE_HEAD, "pad_edge": False, "collapse_padding": True},
        "left": {"title_justify": "left", "show_lines": False},
    }.get(sheet.style, {})
    table = Table(title=sheet.title, caption=sheet.caption, **style)
    for c in sheet.columns:
        table.add_column(c.header, justify=c.justify, overflow="fold" if c.fold else "ellipsis", no_wrap=c.no_wrap)
    for row in sheet.rows:
        table.add_row(*row)
    return table


def show(items: Iterable[Shown] | Shown, out: Console = console) -> None:
    """Print what a library job shows (`_internal.sheet`): tables, plain lines, lines."""
    for item in [items] if isinstance(items, str | Sheet) else items:
        if isinstance(item, Sheet):
            out.print(table_of(item), highlight=item.style != "left")
        elif isinstance(item, Plain):
            out.print(item, highlight=False, soft_wrap=True)
        else:
            out.print(item)


TargetOpt = Annotated[
    str | None,
    typer.Option("--target", help="Base URL of an OpenAI-compatible engine (vLLM, SGLang). Default: the embedded "
                                  "engine."),
]
EngineOpt = Annotated[
    str | None,
    typer.Option("--engine", help="With --target: the engine serving it, where it cannot say itself (vllm, sglang, "
                                  "...; default: it says, through /version or /server_info). Without: the engine "
                                  "the embedded one imitates (vllm, sglang, sglang-mixed; default vllm)."),
]
EngineCommandOpt = Annotated[
    str | None,
    typer.Option("--engine-command", help="With --target: the command line the engine was started with ('vllm "
                                          "serve ...'), recorded (secrets redacted) for what it sets: its chunk size "
                                          "when -B is not given, its CUDA graphs, which the fit reads."),
]
ApiKeyFileOpt = Annotated[
    Path | None,
    typer.Option("--api-key-file", help="File holding the bearer token (else $PDEXPORTER_API_KEY or $OPENAI_API_KEY)."),
]
ModelOpt = Annotated[str | None, typer.Option("--model", help="Served model name (default: the engine's first).")]
ProfileOpt = Annotated[
    str,
    typer.Option("--profile", help="Embedded engine's GPU/model profile (when no --target)."),
]
GpuOpt = Annotated[str | None, typer.Option("--gpu", help="GPU name to record for an external engine.")]
TransferOpt = Annotated[float, typer.Option(
    "--transfer-ms", min=0.0, max=1e7, help="Transfer budget (ms) an offload must beat; the seed's 50 ms.")]
PoolOpt = Annotated[bool, typer.Option(
    "--pool/--no-pool", help="A grid point in several RESULTS_DIRs (or --offloaded dirs): pool its repetitions (one "
    "engine, GPU and model measured in two sessions) instead of refusing the join.")]


def duration_option(flag: str, help: str) -> Any:
    """A duration option: a string in the one duration syntax (read it with `seconds`); the help
    says the syntax. `help` is the option's own words, without a final full stop."""
    return typer.Option(flag, metavar=DURATION, help=f"{help} ({DURATION_SYNTAX}).")


ReadTimeoutOpt = Annotated[
    str | None, duration_option("--read-timeout", "Longest silence allowed inside an engine stream (default 300s)"),
]


def seconds(text: str, flag: str, *, positive: bool = False) -> float:
    """A duration option's value in seconds; one line naming `flag` if it is not one (or is 0
    where `positive`)."""
    value = parse_duration(text, flag)
    if positive and value <= 0:
        raise ConfigError(f"{flag} {text!r}: must be > 0")
    return value


def run_async(coro: Coroutine[Any, Any, T], *, interrupted: Callable[[], str] | None = None) -> T:
    """Run a command's coroutine. With `interrupted`, Ctrl-C (SIGINT) cancels the work (its
    `finally` blocks stop the engine) and ends the command with `Interrupted(interrupted())`,
    whatever the cancelled work raised on its way out (a window cut short fails as a measurement)."""
    if interrupted is None:
        return asyncio.run(coro)

    async def guarded() -> T:
        loop = asyncio.get_running_loop()
        task = asyncio.current_task()
        assert task is not None
        seen: list[int] = []

        def on_sigint() -> None:
            seen.append(signal.SIGINT)
            task.cancel()

        loop.add_signal_handler(signal.SIGINT, on_sigint)
        try:
            return await coro
        except BaseException:
            if seen:
                raise Interrupted(interrupted()) from None
            raise
        finally:
            loop.remove_signal_handler(signal.SIGINT)

    return asyncio.run(guarded())


def api_key(api_key_file: Path | None) -> str | None:
    from pdexporter.client.client import resolve_api_key

    return resolve_api_key(api_key_file)
