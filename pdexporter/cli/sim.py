"""`pdexporter sim`: the embedded engine. `serve` speaks vLLM's HTTP API in real time; `calibrate`
fits a profile's step-time parameters to measured records. Thin: the work is in `pdexporter.sim`."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path
from typing import Annotated

import typer

from rich.table import Table

from pdexporter.cli._common import DEFAULT_PROFILE, console

sim_app = typer.Typer(help="The embedded vLLM-compatible engine (a model of vLLM on a GPU, no GPU needed).",
                      no_args_is_help=True)


def register(app: typer.Typer) -> None:
    app.add_typer(sim_app, name="sim")


def _line(text: str) -> None:
    sys.stdout.write(text + "\n")
    sys.stdout.flush()


@sim_app.command("serve")
def serve(
    profile: Annotated[str, typer.Option("--profile", help="Profile name or YAML path.")] = DEFAULT_PROFILE,
    max_num_batched_tokens: Annotated[int | None, typer.Option(
        "--max-num-batched-tokens", "-B", min=1, help="Token budget per step (the chunk size).")] = None,
    max_num_seqs: Annotated[int | None, typer.Option("--max-num-seqs", min=1, help="Most requests running.")] = None,
    long_prefill_token_threshold: Annotated[int | None, typer.Option(
        "--long-prefill-token-threshold", min=0, help="Cap on one request's tokens per step (0: none).")] = None,
    host: Annotated[str, typer.Option("--host")] = "127.0.0.1",
    port: Annotated[int, typer.Option("--port", min=0, max=65535, help="0 picks a free port.")] = 8000,
    ready_file: Annotated[Path | None, typer.Option(
        "--ready-file", help="Write {url, gpu, version, cuda_graphs, pid} here (atomically) once listening.")] = None,
    otlp_traces_endpoint: Annotated[str | None, typer.Option(
        "--otlp-traces-endpoint", help="Send one vLLM-shaped `llm_request` span per finished request here "
        "(OTLP/HTTP protobuf), as vLLM's flag does.")] = None,
) -> None:
    """Serve vLLM's OpenAI-compatible API from the embedded engine, in real time. Numbers are modelled."""
    from pdexporter._internal.atomic import atomic_write_json
    from pdexporter.sim.profile import load_profile
    from pdexporter.sim.server import ServeOptions, precise_event_loop, run_server

    prof = load_profile(profile)
    options = ServeOptions(max_num_batched_tokens, max_num_seqs, long_prefill_token_threshold, host, port,
                           otlp_traces_endpoint)

    def ready(info: dict[str, object]) -> None:
        _line(f"INFO pdexporter embedded engine (MODELLED, profile {prof.name}, calibration {prof.calibration}, "
              f"max_num_batched_tokens {info['max_num_batched_tokens']}) serving {info['model']} on {info['url']}")
        _line("INFO Asynchronous scheduling is enabled." if prof.engine.async_scheduling else
              "INFO Asynchronous scheduling is disabled.")
        if ready_file is not None:
            atomic_write_json(ready_file, info)

    with asyncio.Runner(loop_factory=precise_event_loop) as runner:
        runner.run(run_server(prof, options, on_ready=ready, log=_line))
    _line("INFO embedded engine stopped")


@sim_app.command("profiles")
def profiles() -> None:
    """List the shipped profiles and how their parameters were obtained."""
    from pdexporter.sim.profile import available_profiles, load_profile

    for name in available_profiles():
        prof = load_profile(name)
        print(f"{name}\t{prof.gpu.name}\t{prof.calibration}")


@sim_app.command("calibrate")
def calibrate_cmd(
    results_dir: Annotated[Path, typer.Argument(help="A results directory: {chunk}/D{d}_P{p}.json records.")],
    profile: Annotated[str, typer.Option("--profile", help="Base profile (its GPU, model, engine).")] = DEFAULT_PROFILE,
    out: Annotated[Path | None, typer.Option("--out", help="Write the fitted profile (YAML) here.")] = None,
    holdout: Annotated[float, typer.Option("--holdout", min=0.0, max=0.9,
                                           help="Fraction of configurations kept out of the fit and predicted.")] = 0.2,
    free: Annotated[str | None, typer.Option(
        "--free", help="Comma-separated parameters to fit (default: the GPU's, then the CPU's and the loop's).")] = None,
    rounds: Annotated[int, typer.Option("--rounds", min=1, max=10,
                                        help="Alternations of the step fit and the engine-loop fit.")] = 2,
    max_evaluations: Annotated[int, typer.Option(
        "--max-evaluations", min=1,
        help="Simulated sweeps per engine-loop fit, its Jacobians included (each predicts every training point).")] = 120,
    report: Annotated[Path | None, typer.Option(
        "--report", help="Write every figure (parameters, fit errors, held-out errors per configuration) as JSON.")] = None,
) -> None:
    """Fit a profile to measured records and report the emulator's error on held-out configurations."""
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    from pdexporter._internal.atomic import atomic_write_json, atomic_write_text
    from pdexporter.errors import ConfigError, RecordError
    from pdexporter.measure.store import ResultsStore
    from pdexporter.sim.calibrate import BOUNDS, DEFAULT_FREE, calibrate, compare_records
    from pdexporter.sim.predict import predict_records
    from pdexporter.sim.profile import load_profile

    screen = Console(width=None if sys.stdout.isatty() else 130)
    names = [f.strip() for f in free.split(",") if f.strip()] if free else list(DEFAULT_FREE)
    unknown = [n for n in names if n not in BOUNDS]
    if unknown:
        raise ConfigError(f"--free {','.join(unknown)}: unknown parameter; fittable: {', '.join(sorted(BOUNDS))}")
    if not results_dir.is_dir():
        raise ConfigError(f"RESULTS_DIR {results_dir}: not a directory")
    base = load_profile(profile)
    records = list(ResultsStore(results_dir).iter_records())
    if not records:
        raise RecordError(f"{results_dir}: no records (expected {{chunk}}/D{{d}}_P{{p}}.json)")
    modelled = sum(1 for r in records if r.config.modelled)
    if modelled:
        console.print(f"[yellow]{modelled} of {len(records)} records are MODELLED (embedded engine): fitting a model to "
                      "a model's output only checks the fitting.[/]")
    gpus = sorted({r.config.gpu for r in records})
    if gpus != [base.gpu.name]:
        console.print(f"[yellow]records are from GPU {', '.join(gpus)}; the base profile is for {base.gpu.name}[/]")
    settings = _settings_of(records[0])
    modes = sorted({r.config.mode for r in records})
    mode = "fast" if modes == ["fast"] else "faithful"

    def predict(prof, keys):  # type: ignore[no-untyped-def]
        return predict_records(prof, keys, settings, mode=mode)

    progress = Progress(TextColumn("[progress.description]{task.description}"), BarColumn(), MofNCompleteColumn(),
                        TextColumn("rms log error {task.fields[rms]}"), TimeElapsedColumn(), TimeRemainingColumn(),
                        console=console,
                        transient=not console.is_terminal)
    tasks: dict[int, int] = {}

    def on_evaluation(round_: int, i: int, rms: float) -> None:
        if round_ not in tasks:
            tasks[round_] = progress.add_task(f"engine-loop fit, round {round_ + 1}/{rounds}", total=max_evaluations,
                                              rms="-")
        progress.update(tasks[round_], completed=min(i, max_evaluations), rms=f"{rms:.4f}")

    try:
        with progress:
            result = calibrate(base, records, holdout=holdout, free=names, source=str(results_dir), predict=predict,
                               rounds=rounds, max_evaluations=max_evaluations, on_evaluation=on_evaluation)
    except ValueError as exc:
        raise ConfigError(f"calibrate {results_dir}: {exc}") from exc

    params = Table(title=f"{base.name}: parameters (* fitted)")
    params.add_column("parameter")
    params.add_column("base", justify="right")
    params.add_column("fitted", justify="right")
    fitted_values: dict[str, object] = {}
    for section in ("step_time", "engine_loop"):
        old, new = getattr(base, section).model_dump(), getattr(result.profile, section).model_dump()
        for name in new:
            mark = " *" if name in names else ""
            fitted_values[f"{section}.{name}"] = new[name]
            params.add_row(f"{section}.{name}{mark}", f"{old[name]}",
                           f"{new[name]:.4g}" if isinstance(new[name], float) else f"{new[name]}")
    screen.print(params)

    fit = Table(title="stage 1: step times of the training configurations (decode steps, middle chunks)")
    fit.add_column("profile")
    fit.add_column("n", justify="right")
    fit.add_column("MAPE", justify="right")
    fit.add_column("worst", justify="right")
    fit.add_column("by kind")
    b_mape, _, b_max, b_kinds = result.before
    fit.add_row("base", str(result.fit.n), f"{b_mape:.1f} %", f"{b_max:.1f} %",
                ", ".join(f"{k} {v:.1f} %" for k, v in b_kinds.items()))
    fit.add_row("fitted", str(result.fit.n), f"{result.fit.mape:.1f} %", f"{result.fit.max_ape:.1f} %",
                ", ".join(f"{k} {v:.1f} %" for k, v in result.fit.by_kind.items()))
    screen.print(fit)
    screen.print(f"training: {len(result.train_keys)} configurations, {result.train.reps_used} reps with every "
                 f"chunk seen, {result.train.reps_mismatched} reps whose chunk steps did not match their chunks "
                 "(decode step only)")
    if result.loop is not None:
        screen.print(f"stage 2 (engine loop, by simulation in {mode} mode): {result.loop.n_configs} configurations, "
                     f"{result.loop.n_residuals} residuals, rms log error {result.loop.rms_log:.3f} after "
                     f"{result.loop.evaluations} simulated sweeps ({result.loop.message})")

    payload: dict[str, object] = {
        "results_dir": str(results_dir), "base_profile": base.name, "holdout": holdout, "mode": mode,
        "free": names, "rounds": result.rounds, "parameters": fitted_values,
        "train_configurations": sorted(map(list, result.train_keys)),
        "held_out_configurations": sorted(map(list, result.held_keys)),
        "stage1": {"n": result.fit.n, "mape": result.fit.mape, "by_kind": result.fit.by_kind},
        "stage2": None if result.loop is None else {"rms_log": result.loop.rms_log, "evaluations": result.loop.evaluations},
    }
    if result.held_keys:
        held_records = {r.key: r for r in records if r.key in result.held_keys}
        for label, prof in (("base", base), ("fitted", result.profile)):
            held = compare_records(held_records, predict(prof, result.held_keys))
            table = Table(title=f"{label} profile: MAPE on the {len(result.held_keys)} held-out configurations "
                                f"(predicted by running the protocol on the embedded engine, {mode} mode)")
            table.add_column("metric")
            mapes = held.table()
            chunks = [k for k in mapes["prefill_duration"] if k != "all"]
            for c in chunks:
                table.add_column(f"B={c}", justify="right")
            table.add_column("all", justify="right")
            for metric, label_ in (("prefill_duration", "prefill_duration"),
                                   ("during_tpot", "TPOT during prefill (p50)"),
                                   ("window_tpot", "TPOT over the window (p50)"),
                                   ("baseline_tpot", "baseline TPOT")):
                table.add_row(label_, *[_pct(mapes[metric].get(c)) for c in chunks], _pct(mapes[metric]["all"]))
            screen.print(table)
            payload[f"held_out_{label}"] = {
                "mape": mapes,
                "points": {m: [{"key": list(e.key), "measured": e.measured, "predicted": e.predicted}
                               for e in getattr(held, m)] for m in mapes},
            }
    else:
        screen.print("no configuration held out (--holdout 0): the errors above are in-sample")

    if out is not None:
        named = result.profile.model_copy(update={"name": out.stem})
        atomic_write_text(out, named.to_yaml())
        screen.print(f"fitted profile written: {out} (calibration: calibrated)")
    if report is not None:
        atomic_write_json(report, payload)
        screen.print(f"report written: {report}")


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{x:.1f} %"


def _settings_of(record: object) -> object:
    from pdexporter.measure.protocol import ProtocolSettings

    c = record.config  # type: ignore[attr-defined]
    return ProtocolSettings(decode_context_tokens=c.decode_context_tokens, decode_output_tokens=c.decode_output_tokens,
                            prefill_max_tokens=c.prefill_max_tokens)


def _register_sweep() -> None:
    """`pdexporter sim sweep`: the sweep controller on the embedded engine's virtual clock."""
    from pdexporter.cli.sweep import sim_sweep

    sim_app.command("sweep")(sim_sweep)


_register_sweep()
