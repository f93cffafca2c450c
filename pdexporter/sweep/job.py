"""`pdexporter sweep` and `pdexporter sim sweep` as jobs: the sweep file read with the command
line's settings (`sweep_spec`, `prediction_spec`), the grid run by `SweepController` on the file's
engines (`run_sweep`; with `listen`, each window's gauges on /metrics meanwhile: `WindowExporter`),
and the report told (`outcome`: the summary table, the notes, the exit code)."""

from __future__ import annotations

import asyncio
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pdexporter._internal.durations import parse_duration
from pdexporter._internal.sheet import Column, Sheet, Shown
from pdexporter.errors import ConfigError
from pdexporter.launch.specs import SimLauncherSpec
from pdexporter.measure.records import RepRecord, RunRecord
from pdexporter.measure.store import ResultsStore
from pdexporter.sweep.controller import PHASES, Deadline, Key, SweepController, SweepObserver, SweepReport
from pdexporter.sweep.plan import ConfigStatus
from pdexporter.sweep.providers import make_providers, sim_imitation_for, sim_role_for
from pdexporter.sweep.spec import SweepSpec, load_sweep, prediction_root

__all__ = [
    "EXIT_DEADLINE", "EXIT_INCOMPLETE", "PHASE_HEADERS", "Outcome", "WindowExporter", "grid_axes", "outcome",
    "prediction_out", "prediction_spec", "run_sweep", "slot_lines", "summary_sheet", "sweep_spec",
]


EXIT_DEADLINE = 5
EXIT_INCOMPLETE = 4  # as a MeasurementError: some configurations could not be measured


def _load(path: Path, mode: str | None, reps: int | None, listen: str | None, overrides: dict[str, Any],
          chunk_index: int | None = None, flags: dict[str, str] | None = None,
          external: tuple[str, int | None, str] | None = None) -> SweepSpec:
    """The sweep file with the command line's settings; a bad setting is blamed on its flag."""
    flags = {**(flags or {}), "mode": "--mode", "reps": "--reps", "listen": "--listen"}
    for key, value in (("mode", mode), ("reps", reps), ("listen", listen)):
        if value is not None:
            overrides[key] = value
    return load_sweep(path, overrides, chunk_index=chunk_index, external=external,
                      flags={k: v for k, v in flags.items() if k in overrides or k.split(".")[0] in overrides
                             or (external is not None and k.startswith("launcher"))})


def sweep_spec(path: Path, *, mode: str | None = None, reps: int | None = None, cooldown: str | None = None,
               listen: str | None = None, clock: str | None = None, target: str | None = None,
               chunk_size: int | None = None, chunk_index: int | None = None,
               read_timeout: str | None = None, engine_command: str | None = None) -> SweepSpec:
    """`pdexporter sweep`'s sweep: the file, with the command line's settings over it (`--target`:
    an external engine in place of the file's launcher, measured at its one chunk size; `--engine-command`:
    how it was started, which gives that chunk size where --chunk-size does not)."""
    from pdexporter.client.client import read_timeout_seconds
    from pdexporter.launch.choose import command_of

    overrides: dict[str, Any] = {}
    flags = {"launcher.clock": "--clock", "cooldown.seconds": "--cooldown", "read_timeout_s": "--read-timeout"}
    if cooldown is not None:
        overrides["cooldown.seconds"] = parse_duration(cooldown, "--cooldown")
    if read_timeout is not None:
        overrides["read_timeout_s"] = read_timeout_seconds(read_timeout)
    if clock is not None:
        overrides["launcher.clock"] = clock
    if target is None and chunk_size is not None:
        raise ConfigError(f"--chunk-size {chunk_size}: only with --target (the file's launcher sets the chunk "
                          "sizes it starts its engines with)")
    words, said = command_of(target, engine_command, chunk_size, None)
    said_by = "--chunk-size"
    if words is not None:
        if chunk_size is None and said is not None:
            chunk_size, said_by = said[1], f"--engine-command's {said[0]}"
        overrides["launcher.command"] = engine_command
        flags["launcher.command"] = "--engine-command"
    if target is not None:
        # The file's launcher is replaced: an external engine cannot be restarted per chunk size, so
        # the grid runs at the one chunk size it has (spec.external_engine).
        flags.update({"launcher.url": "--target", "launcher.chunk_size": "--chunk-size", "launcher": "--target"})
    return _load(path, mode, reps, listen, overrides, chunk_index, flags,
                 external=None if target is None else (target, chunk_size, said_by))


def prediction_spec(path: Path, *, profile: str | None = None, mode: str | None = None, reps: int | None = None,
                    chunk_index: int | None = None) -> SweepSpec:
    """`pdexporter sim sweep`'s sweep: the file's grid on embedded engines on a virtual clock. The
    file's engine setup decides which arm is modelled (a pair or DecodeBench: the offloaded one) and
    which engine the embedded one imitates (SGLang, in its mode, for an SGLang command), and as many
    embedded engines side by side as the file has GPUs (its wall time too)."""
    file_spec = load_sweep(path, chunk_index=chunk_index)
    launcher: dict[str, Any] = {"kind": "sim", "clock": "virtual", "kv_role": sim_role_for(file_spec.launcher),
                                "engines": file_spec.slots, "engine": sim_imitation_for(file_spec.launcher)}
    if profile is not None:  # else the imitated engine's (`SimLauncherSpec`)
        launcher["profile"] = profile
    return _load(path, mode, reps, None, {"launcher": launcher}, chunk_index, {"launcher.profile": "--profile"})


def grid_axes(path: Path) -> tuple[list[int], list[int]]:
    """A sweep file's D and P values (`export-table --grid`)."""
    grid = load_sweep(path).grid
    return grid.decode_batch_sizes, grid.new_prefill_tokens


def prediction_out(spec: SweepSpec, path: Path, default_profile: str) -> Path:
    """Where `sim sweep` writes without --out: results/sim/{profile}/{sweep name}."""
    used = spec.launcher.profile if isinstance(spec.launcher, SimLauncherSpec) else default_profile
    return prediction_root(used, spec.name or path.stem)


class WindowExporter(SweepObserver):
    """`listen`: each window's gauges on /metrics while sweeping (the exporter's series); every
    event is handed on to `inner`."""

    def __init__(self, inner: SweepObserver) -> None:
        self.inner = inner
        self.metrics: Any = None
        self.url: str | None = None
        self._runner: Any = None

    async def start(self, listen: str) -> str:
        from pdexporter.exporter.metrics import ExporterMetrics, set_up
        from pdexporter.exporter.server import metrics_app, parse_listen, start_metrics_server

        host, port = parse_listen(listen)
        self.metrics = ExporterMetrics()
        set_up(self.metrics, "ok")
        self._runner, bound = await start_metrics_server(
            metrics_app(self.metrics.registry, title="pdexporter sweep"), host, port
        )
        shown = "127.0.0.1" if host in ("0.0.0.0", "") else host
        self.url = f"http://{shown}:{bound}/metrics"
        return self.url

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    def on_plan(self, total: int, done: int, reps_to_run: int) -> None:
        self.inner.on_plan(total, done, reps_to_run)

    def on_chunk(self, slot: int, label: str, chunk: int, reps_to_run: int) -> None:
        self.inner.on_chunk(slot, label, chunk, reps_to_run)

    def on_phase(self, phase: str, chunk: int, d: int | None = None, p: int | None = None) -> None:
        self.inner.on_phase(phase, chunk, d, p)

    def on_rep(self, key: Key, rep: RepRecord, info: Any) -> None:
        from pdexporter.exporter.metrics import grid_labels, publish_window, set_engine_info

        self.inner.on_rep(key, rep, info)
        publish_window(self.metrics, grid_labels(*key, engine=info.kind), rep)
        set_engine_info(self.metrics, info.kind, info.model, key[0], info.modelled)

    def on_config(self, key: Key, record: RunRecord | None, status: ConfigStatus) -> None:
        self.inner.on_config(key, record, status)

    def on_message(self, text: str) -> None:
        self.inner.on_message(text)


def run_sweep(spec: SweepSpec, store: ResultsStore, observer: SweepObserver, *, deadline: float | None = None,
              keep_engine: bool = False, token: str | None = None) -> SweepReport:
    """Run the grid (resumable: what `store` holds is not measured again) on the file's engines,
    on the virtual clock where its embedded engines run on one; `observer` sees every step (and,
    where it is a context manager, is entered around the run: a progress display).
    `deadline`: a `time.monotonic` value to stop before, between runs."""
    virtual = isinstance(spec.launcher, SimLauncherSpec) and spec.launcher.clock == "virtual"
    dl = Deadline(deadline)
    providers = make_providers(spec, store, api_key=token, deadline=dl.left, on_message=observer.on_message)
    engines = providers[0].description if len(providers) == 1 else (
        f"{len(providers)} engines side by side ({', '.join(p.description for p in providers)})")
    order = "" if spec.order.kind == "blocked" else f", interleaved (seed {spec.order.seed})"
    observer.on_message(f"[bold]sweep[/] {spec.name or ''} {spec.grid.size} configs x {spec.reps} reps, {spec.mode} "
                        f"mode{order}, {engines}; results in {store.root}")
    exporter = WindowExporter(observer) if spec.listen else None

    async def main() -> SweepReport:
        if exporter is not None:
            observer.on_message(f"exporting window gauges on {await exporter.start(spec.listen or '')}")
        try:
            with observer if isinstance(observer, AbstractContextManager) else nullcontext():
                return await SweepController(spec, store, providers, observer=exporter or observer, deadline=dl,
                                             keep_engine=keep_engine).run()
        finally:
            if exporter is not None:
                await exporter.stop()

    if virtual:
        from pdexporter._internal.vloop import run_virtual

        return run_virtual(main())
    return asyncio.run(main())


@dataclass
class Outcome:
    shown: list[Shown]
    exit_code: int


def outcome(report: SweepReport) -> Outcome:
    """What the sweep's end shows (the summary, the notes) and its exit code: 0 complete, 5 stopped
    at the deadline, 4 some configurations failed after their retries."""
    shown: list[Shown] = [summary_sheet(report), *slot_lines(report)]
    checked = sum(c.injections_checked for c in report.chunks.values())
    busy = sum(c.busy_at_injection for c in report.chunks.values())
    retried = sum(c.retries for c in report.chunks.values())
    if checked:
        shown.append(f"engine at injection: {checked - busy}/{checked} injections found exactly D requests running "
                     f"and none waiting" + (f"; [yellow]{busy} did not[/]" if busy else ""))
    if retried:
        shown.append(f"{retried} run(s) retried after a measurement error (see the messages above)")
    if report.status == "incomplete":
        shown.append(f"[red]{report.message}[/]; rerun the same command to try them again.")
        return Outcome(shown, EXIT_INCOMPLETE)
    if report.status == "deadline":
        shown.append(f"[yellow]{report.message}[/]; {report.complete_configs}/{report.total_configs} configs "
                     "complete. Rerun the same command to continue.")
        return Outcome(shown, EXIT_DEADLINE)
    return Outcome(shown, 0)


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


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def summary_sheet(report: SweepReport) -> Sheet:
    """Per chunk size: configs, reps, median penalty, flagged configs, time per phase."""
    virtual = _virtual(report)
    slots = any(c.slot for c in report.chunks.values())
    heads = ["chunk", *(["engine"] if slots else []), "configs", "reps", "penalty\nms p50", "CV\nflag", "re-\nrun",
             *(PHASE_HEADERS[p] for p in PHASES)]
    table = Sheet(
        f"sweep {report.status}: {report.complete_configs}/{report.total_configs} configs, {report.mode} mode",
        [Column(h, "left" if h == "engine" else "right") for h in heads],
        caption=(f"time per phase in modelled engine seconds (virtual clock); {report.engine_s:.0f} s modelled, "
                 f"{report.wall_s:.1f} s on this machine") if virtual else f"time per phase in seconds; "
                f"{report.wall_s:.1f} s in all",
        style="compact",
    )
    for b, c in report.chunks.items():
        times = c.engine_s if virtual else c.wall_s
        table.add_row(
            str(b), *([c.slot or "-"] if slots else []), f"{c.configs_complete}/{c.configs}", str(c.reps_recorded),
            _ms(c.median_penalty_ms), str(len(c.flagged)), str(len(c.rerun)), *(f"{times[p]:.1f}" for p in PHASES),
        )
    return table
