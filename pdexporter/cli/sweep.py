"""`pdexporter sweep SWEEP.yaml` and `pdexporter sim sweep SWEEP.yaml --profile P`.

Thin: load the sweep file, pick the engine provider, run `SweepController` under a progress bar,
print the summary table. Exit codes: 0 the sweep is complete; 5 it stopped at `--deadline` (rerun
the same command to continue); 4 some configurations failed after their retries (the others are
recorded; rerun to try them again); 2/3 bad input / engine errors.
"""

from __future__ import annotations

import asyncio
import sys
import time
from pathlib import Path
from typing import Annotated, Any

import typer
from rich import box
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.table import Table

from pdexporter._internal.writable import check_writable
from pdexporter.cli._common import (
    DEFAULT_PROFILE,
    ApiKeyFileOpt,
    ReadTimeoutOpt,
    api_key,
    console,
    duration_option,
    seconds,
)
from pdexporter.cli._vocab import B_FLAGS
from pdexporter.client.client import read_timeout_seconds
from pdexporter.errors import ConfigError
from pdexporter.launch.specs import SimLauncherSpec
from pdexporter.measure.records import RepRecord, RunRecord
from pdexporter.measure.store import ResultsStore
from pdexporter.sweep.controller import PHASES, Deadline, Key, SweepController, SweepObserver, SweepReport
from pdexporter.sweep.plan import ConfigStatus
from pdexporter.sweep.providers import make_providers
from pdexporter.sweep.spec import SweepSpec, load_sweep, prediction_root

EXIT_DEADLINE = 5
EXIT_INCOMPLETE = 4  # as a MeasurementError: some configurations could not be measured

SweepFileArg = Annotated[Path, typer.Argument(help="Sweep file (see sweeps/*.yaml and docs/sweep.md).")]
OutOpt = Annotated[Path | None, typer.Option("--out", help="Results directory (default: the file's `output`).")]
ModeOpt = Annotated[str | None, typer.Option("--mode", help="faithful | fast (default: the file's `mode`).")]
RepsOpt = Annotated[int | None, typer.Option("--reps", min=1, help="Repetitions per configuration.")]
DeadlineOpt = Annotated[
    str | None,
    duration_option("--deadline", "How long from now: stop cleanly between runs before then (exit 5)"),
]
CooldownOpt = Annotated[
    str | None,
    duration_option("--cooldown", "Faithful mode's wait after each run (default: the file's cooldown.seconds)"),
]
ListenOpt = Annotated[
    str | None, typer.Option("--listen", help="HOST:PORT: export each window's gauges on /metrics while sweeping.")
]
ChunkIndexOpt = Annotated[
    int | None,
    typer.Option("--chunk-index", min=0, help="Run only the I-th chunk size of the grid, in file order "
                                              "(a Kubernetes Indexed Job's completion index)."),
]


def register(app: typer.Typer) -> None:
    app.command("sweep")(sweep)


def register_sim(sim_app: typer.Typer) -> None:
    """`pdexporter sim sweep`: called from `pdexporter.cli.sim`."""
    sim_app.command("sweep")(sim_sweep)


def sweep(
    sweep_file: SweepFileArg,
    out: OutOpt = None,
    mode: ModeOpt = None,
    reps: RepsOpt = None,
    cooldown: CooldownOpt = None,
    deadline: DeadlineOpt = None,
    listen: ListenOpt = None,
    keep_engine: Annotated[
        bool, typer.Option("--keep-engine", help="Leave the last engine running (local launcher) for a later run.")
    ] = False,
    clock: Annotated[
        str | None, typer.Option("--clock", help="Embedded engine only: virtual | real (default: the file's).")
    ] = None,
    target: Annotated[
        str | None,
        typer.Option("--target", help="Measure an engine already running at this URL (external launcher)."),
    ] = None,
    chunk_size: Annotated[
        int | None,
        typer.Option(*B_FLAGS, min=1, help="With --target: the engine's max_num_batched_tokens (tokens per step); "
                                            "the grid runs at this chunk size only (default: the grid's, when it "
                                            "has one)."),
    ] = None,
    api_key_file: ApiKeyFileOpt = None,
    chunk_index: ChunkIndexOpt = None,
    read_timeout: ReadTimeoutOpt = None,
) -> None:
    """Run the grid of a sweep file: engine per chunk size, warm-up, Phase 1, Phase 2 x reps; resumable."""
    started = time.monotonic()
    deadline_s = None if deadline is None else seconds(deadline, "--deadline", positive=True)
    overrides: dict[str, Any] = {}
    flags = {"launcher.clock": "--clock", "cooldown.seconds": "--cooldown", "read_timeout_s": "--read-timeout"}
    if cooldown is not None:
        overrides["cooldown.seconds"] = seconds(cooldown, "--cooldown")
    if read_timeout is not None:
        overrides["read_timeout_s"] = read_timeout_seconds(read_timeout)
    if clock is not None:
        overrides["launcher.clock"] = clock
    if target is None and chunk_size is not None:
        raise ConfigError(f"--chunk-size {chunk_size}: only with --target (the file's launcher sets the chunk "
                          "sizes it starts its engines with)")
    if target is not None:
        # The file's launcher is replaced: an external engine cannot be restarted per chunk size, so
        # the grid runs at the one chunk size it has (spec.external_engine).
        flags.update({"launcher.url": "--target", "launcher.chunk_size": "--chunk-size", "launcher": "--target"})
    spec = _load(sweep_file, mode, reps, listen, overrides, chunk_index, flags,
                 external=None if target is None else (target, chunk_size))
    store = ResultsStore(check_writable(out or Path(spec.output), "--out" if out else f"{sweep_file}: output"))
    report = _run(spec, store, deadline=None if deadline_s is None else started + deadline_s,
                  keep_engine=keep_engine, token=api_key(api_key_file))
    _finish(spec, store, report)


def sim_sweep(
    sweep_file: SweepFileArg,
    profile: Annotated[str | None, typer.Option(
        "--profile", help="Embedded engine's GPU/model profile (default: the imitated engine's: SGLang's "
                          "h200-sglang0.5.15-qwen3-coder-30b-a3b for an SGLang sweep, else "
                          f"{DEFAULT_PROFILE}).")] = None,
    out: Annotated[
        Path | None, typer.Option("--out", help="Results directory (default: results/sim/{profile}/{sweep name}).")
    ] = None,
    mode: ModeOpt = None,
    reps: RepsOpt = None,
    chunk_index: ChunkIndexOpt = None,
) -> None:
    """Predict a sweep's whole table with the embedded engine on a virtual clock (records say modelled)."""
    from pdexporter.sweep.providers import sim_imitation_for, sim_role_for

    # The file's engine setup decides which arm is modelled (a pair or DecodeBench: the offloaded
    # one) and which engine the embedded one imitates (SGLang, in its mode, for an SGLang command),
    # and as many embedded engines side by side as the file has GPUs (its wall time too).
    file_spec = load_sweep(sweep_file, chunk_index=chunk_index)
    role, engines = sim_role_for(file_spec.launcher), file_spec.slots
    launcher: dict[str, Any] = {"kind": "sim", "clock": "virtual", "kv_role": role, "engines": engines,
                                "engine": sim_imitation_for(file_spec.launcher)}
    if profile is not None:  # else the imitated engine's (`SimLauncherSpec`)
        launcher["profile"] = profile
    spec = _load(sweep_file, mode, reps, None, {"launcher": launcher}, chunk_index, {"launcher.profile": "--profile"})
    used = spec.launcher.profile if isinstance(spec.launcher, SimLauncherSpec) else (profile or DEFAULT_PROFILE)
    store = ResultsStore(check_writable(out or prediction_root(used, spec.name or sweep_file.stem),
                                        "--out" if out else "output"))
    report = _run(spec, store, deadline=None, keep_engine=False, token=None)
    _finish(spec, store, report)


def _load(path: Path, mode: str | None, reps: int | None, listen: str | None, overrides: dict[str, Any],
          chunk_index: int | None = None, flags: dict[str, str] | None = None,
          external: tuple[str, int | None] | None = None) -> SweepSpec:
    """The sweep file with the command line's settings; a bad setting is blamed on its flag."""
    flags = {**(flags or {}), "mode": "--mode", "reps": "--reps", "listen": "--listen"}
    if mode is not None:
        overrides["mode"] = mode
    if reps is not None:
        overrides["reps"] = reps
    if listen is not None:
        overrides["listen"] = listen
    return load_sweep(path, overrides, chunk_index=chunk_index, external=external,
                      flags={k: v for k, v in flags.items() if k in overrides or k.split(".")[0] in overrides
                             or (external is not None and k.startswith("launcher"))})


def _run(
    spec: SweepSpec, store: ResultsStore, *, deadline: float | None, keep_engine: bool, token: str | None
) -> SweepReport:
    observer = ProgressObserver(spec)
    virtual = isinstance(spec.launcher, SimLauncherSpec) and spec.launcher.clock == "virtual"
    dl = Deadline(deadline)
    providers = make_providers(spec, store, api_key=token, deadline=dl.left, on_message=observer.on_message)
    engines = providers[0].description if len(providers) == 1 else (
        f"{len(providers)} engines side by side ({', '.join(p.description for p in providers)})")
    order = "" if spec.order.kind == "blocked" else f", interleaved (seed {spec.order.seed})"
    console.print(f"[bold]sweep[/] {spec.name or ''} {spec.grid.size} configs x {spec.reps} reps, {spec.mode} mode"
                  f"{order}, {engines}; results in {store.root}")
    controller = SweepController(spec, store, providers, observer=observer, deadline=dl, keep_engine=keep_engine)

    async def main() -> SweepReport:
        server = await observer.start_exporter(spec.listen) if spec.listen else None
        try:
            with observer:
                return await controller.run()
        finally:
            if server is not None:
                await server.cleanup()

    if virtual:
        from pdexporter._internal.vloop import run_virtual

        return run_virtual(main())
    return asyncio.run(main())


def _finish(spec: SweepSpec, store: ResultsStore, report: SweepReport) -> None:
    console.print(summary_table(report))
    for line in slot_lines(report):
        console.print(line)
    checked = sum(c.injections_checked for c in report.chunks.values())
    busy = sum(c.busy_at_injection for c in report.chunks.values())
    retried = sum(c.retries for c in report.chunks.values())
    if checked:
        console.print(f"engine at injection: {checked - busy}/{checked} injections found exactly D requests running "
                      f"and none waiting" + (f"; [yellow]{busy} did not[/]" if busy else ""))
    if retried:
        console.print(f"{retried} run(s) retried after a measurement error (see the messages above)")
    if report.status == "incomplete":
        console.print(f"[red]{report.message}[/]; rerun the same command to try them again.")
        print(store.root)
        sys.exit(EXIT_INCOMPLETE)
    if report.status == "deadline":
        console.print(f"[yellow]{report.message}[/]; {report.complete_configs}/{report.total_configs} configs "
                      "complete. Rerun the same command to continue.")
        print(store.root)
        sys.exit(EXIT_DEADLINE)
    print(store.root)


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


PHASE_HEADERS = {"engine_start": "start", "warmup": "warm-up", "phase1": "phase1", "phase2": "phase2",
                 "cooldown": "cool"}


def _virtual(report: SweepReport) -> bool:
    return abs(report.engine_s - report.wall_s) > 1.0


def slot_lines(report: SweepReport) -> list[str]:
    """With several engines: each one's chunk sizes and time per phase (the wall is the slowest)."""
    slots = sorted({c.slot for c in report.chunks.values() if c.slot})
    lines = []
    for slot in slots:
        chunks = [c for c in report.chunks.values() if c.slot == slot]
        totals = {p: sum((c.engine_s if _virtual(report) else c.wall_s)[p] for c in chunks) for p in PHASES}
        lines.append(f"{slot}: chunk sizes {', '.join(str(c.chunk_size) for c in chunks)}; "
                     + ", ".join(f"{PHASE_HEADERS[p]} {totals[p]:.1f} s" for p in PHASES)
                     + f"; {sum(totals.values()):.1f} s in all")
    return lines


def summary_table(report: SweepReport) -> Table:
    """Per chunk size: configs, reps, median penalty, flagged configs, time per phase."""
    virtual = _virtual(report)
    table = Table(
        box=box.SIMPLE_HEAD, pad_edge=False, collapse_padding=True,
        title=f"sweep {report.status}: {report.complete_configs}/{report.total_configs} configs, {report.mode} mode",
        caption=(f"time per phase in modelled engine seconds (virtual clock); {report.engine_s:.0f} s modelled, "
                 f"{report.wall_s:.1f} s on this machine") if virtual else f"time per phase in seconds; "
                f"{report.wall_s:.1f} s in all",
    )
    slots = any(c.slot for c in report.chunks.values())
    table.add_column("chunk", justify="right")
    if slots:
        table.add_column("engine")
    table.add_column("configs", justify="right")
    table.add_column("reps", justify="right")
    table.add_column("penalty\nms p50", justify="right")
    table.add_column("CV\nflag", justify="right")
    table.add_column("re-\nrun", justify="right")
    for phase in PHASES:
        table.add_column(PHASE_HEADERS[phase], justify="right")
    for b, c in report.chunks.items():
        times = c.engine_s if virtual else c.wall_s
        table.add_row(
            str(b), *([c.slot or "-"] if slots else []), f"{c.configs_complete}/{c.configs}", str(c.reps_recorded),
            _ms(c.median_penalty_ms), str(len(c.flagged)), str(len(c.rerun)), *(f"{times[p]:.1f}" for p in PHASES),
        )
    return table


class ProgressObserver(SweepObserver):
    """Rich progress: one bar over all repetitions (configs done, ETA) and, with several engines,
    one bar per engine slot (its chunk size, phase and repetitions, ETA)."""

    def __init__(self, spec: SweepSpec) -> None:
        self.spec = spec
        self.progress = Progress(
            TextColumn("[bold]{task.fields[configs]}"),
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("reps"),
            TimeElapsedColumn(),
            TimeRemainingColumn(),
            console=console,
            refresh_per_second=4,
            transient=False,
        )
        self.task = self.progress.add_task("starting", total=None, configs="")
        self.several = spec.slots > 1
        self.slot_tasks: dict[int, Any] = {}  # slot -> its bar
        self.chunk_slot: dict[int, tuple[int, str]] = {}  # chunk size -> (slot, label)
        self.total = 0
        self.configs_done = 0
        self.metrics: Any = None
        self.exporter_url: str | None = None
        self.interactive = console.is_terminal
        self.t0 = time.monotonic()

    def __enter__(self) -> ProgressObserver:
        self.progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.progress.stop()

    async def start_exporter(self, listen: str) -> Any:
        from pdexporter.exporter.metrics import ExporterMetrics, set_up
        from pdexporter.exporter.server import metrics_app, parse_listen, start_metrics_server

        host, port = parse_listen(listen)
        self.metrics = ExporterMetrics()
        set_up(self.metrics, "ok")
        runner, bound = await start_metrics_server(
            metrics_app(self.metrics.registry, title="pdexporter sweep"), host, port
        )
        shown = "127.0.0.1" if host in ("0.0.0.0", "") else host
        self.exporter_url = f"http://{shown}:{bound}/metrics"
        console.print(f"exporting window gauges on {self.exporter_url}")
        return runner

    def _configs(self) -> str:
        return f"{self.configs_done}/{self.total} configs"

    def on_plan(self, total: int, done: int, reps_to_run: int) -> None:
        self.total, self.configs_done = total, done
        self.progress.update(self.task, total=max(1, reps_to_run), completed=0 if reps_to_run else 1,
                             configs=self._configs(), description="all engines" if self.several else "starting")

    def on_chunk(self, slot: int, label: str, chunk: int, reps_to_run: int) -> None:
        self.chunk_slot[chunk] = (slot, label)
        if not self.several:
            return
        name = label or f"engine {slot}"
        if slot not in self.slot_tasks:
            self.slot_tasks[slot] = self.progress.add_task(f"B={chunk}", total=max(1, reps_to_run), configs=name)
        else:  # a new chunk size on this engine: the bar starts over
            self.progress.reset(self.slot_tasks[slot], total=max(1, reps_to_run), description=f"B={chunk}")

    def _where(self, chunk: int) -> str:
        label = self.chunk_slot.get(chunk, (0, ""))[1]
        return f"{label} " if self.several and label else ""

    def on_phase(self, phase: str, chunk: int, d: int | None = None, p: int | None = None) -> None:
        where = f"B={chunk}" + (f" D={d}" if d is not None else "") + (f" P={p}" if p is not None else "")
        slot = self.chunk_slot.get(chunk, (0, ""))[0]
        task = self.slot_tasks.get(slot) if self.several else self.task
        if task is not None:
            self.progress.update(task, description=f"{where} {phase}")
        if not self.interactive and phase in ("engine_start", "warmup", "phase1"):
            self.on_message(f"{self._stamp()} {self._where(chunk)}{where} {phase}")

    def _advance(self, task: Any) -> None:
        current = next(t for t in self.progress.tasks if t.id == task)
        if current.total is not None and current.completed + 1 > current.total:
            self.progress.update(task, total=current.completed + 1)  # CV re-runs add repetitions
        self.progress.advance(task)

    def on_rep(self, key: Key, rep: RepRecord, info: Any) -> None:
        self._advance(self.task)
        slot = self.chunk_slot.get(key[0], (0, ""))[0]
        if self.several and slot in self.slot_tasks:
            self._advance(self.slot_tasks[slot])
        if self.metrics is not None:
            from pdexporter.exporter.metrics import grid_labels, publish_window, set_engine_info

            publish_window(self.metrics, grid_labels(*key, engine=info.kind), rep)
            set_engine_info(self.metrics, info.kind, info.model, key[0], info.modelled)

    def _stamp(self) -> str:
        return f"[{time.monotonic() - self.t0:6.0f} s]"

    def on_config(self, key: Key, record: RunRecord | None, status: ConfigStatus) -> None:
        self.configs_done += 1
        self.progress.update(self.task, configs=self._configs())
        if not self.interactive and record is not None:
            # Logs (CI, a remote GPU call) get one line per configuration instead of a bar.
            pen = record.derived.tpot_penalty_ms
            cv = record.summary.cv_tpot_penalty if record.summary else None
            self.on_message(
                f"{self._stamp()} {self._configs()} {self._where(key[0])}B={key[0]} D={key[1]} P={key[2]}: "
                f"prefill {record.interference.prefill_duration_ms:.1f} ms"
                + (f", penalty {pen:.2f} ms" if pen is not None else "")
                + (f", CV {cv:.1%}" if cv is not None else "")
                + (f", chunks {record.interference.num_chunks_actual}/{record.interference.num_chunks_expected}"
                   if record.interference.num_chunks_actual is not None else "")
            )
        if status.flagged:
            cv = status.cv_by_attempt[-1] if status.cv_by_attempt else None
            self.on_message(f"B={key[0]} D={key[1]} P={key[2]}: flagged, CV {cv:.1%} still above "
                            f"{self.spec.cv.threshold:.0%} after {status.complete_attempts} attempt(s)")

    def on_message(self, text: str) -> None:
        self.progress.console.print(text, soft_wrap=True, highlight=False)
