"""`pdexporter sim`: the embedded engine. `serve` speaks vLLM's HTTP API in real time; `calibrate`
fits a profile's step-time parameters to measured records. Thin: the work is in `pdexporter.sim`."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path
from typing import Annotated

import typer

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
) -> None:
    """Serve vLLM's OpenAI-compatible API from the embedded engine, in real time. Numbers are modelled."""
    from pdexporter._internal.atomic import atomic_write_json
    from pdexporter.sim.profile import load_profile
    from pdexporter.sim.server import ServeOptions, precise_event_loop, run_server

    prof = load_profile(profile)
    options = ServeOptions(max_num_batched_tokens, max_num_seqs, long_prefill_token_threshold, host, port)

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
        "--free", help="Comma-separated step_time parameters to fit (default: overheads and efficiencies).")] = None,
) -> None:
    """Fit a profile's step-time parameters to measured records and print the fit error."""
    from rich.console import Console
    from rich.table import Table

    from pdexporter._internal.atomic import atomic_write_text
    from pdexporter.errors import ConfigError, RecordError
    from pdexporter.measure.store import ResultsStore
    from pdexporter.sim.calibrate import DEFAULT_FREE, HoldoutReport, calibrate, compare_records
    from pdexporter.sim.predict import predict_records
    from pdexporter.sim.profile import load_profile

    screen = Console(width=None if sys.stdout.isatty() else 130)
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
    try:
        names = [f.strip() for f in free.split(",") if f.strip()] if free else list(DEFAULT_FREE)
        result = calibrate(base, records, holdout=holdout, free=names, source=str(results_dir))
    except ValueError as exc:
        raise ConfigError(f"calibrate {results_dir}: {exc}") from exc

    params = Table(title=f"{base.name}: step-time parameters")
    params.add_column("parameter")
    params.add_column("base", justify="right")
    params.add_column("fitted", justify="right")
    old, new = base.step_time.model_dump(), result.fit.params.model_dump()
    for name in new:
        mark = " *" if name in result.fit.free else ""
        params.add_row(name + mark, f"{old[name]}", f"{new[name]:.4g}" if isinstance(new[name], float) else f"{new[name]}")
    screen.print(params)

    fit = Table(title="fit error on step times (training configurations)")
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
                  f"chunk seen, {result.train.reps_mismatched} reps whose slow steps did not match their chunks "
                  "(decode step only)")

    if result.held_keys:
        held_records = {r.key: r for r in records if r.key in result.held_keys}
        settings = _settings_of(records[0])
        table = Table(title=f"held-out configurations ({len(result.held_keys)}): predicted by running the protocol "
                            "on the embedded engine in virtual time")
        table.add_column("profile")
        table.add_column("step times MAPE", justify="right")
        table.add_column("prefill_duration MAPE", justify="right")
        table.add_column("window TPOT MAPE", justify="right")
        table.add_column("TPOT during prefill MAPE", justify="right")
        table.add_column("baseline TPOT MAPE", justify="right")
        for label, prof, step_mape in (("base", base, result.held_step_mape_before),
                                       ("fitted", result.profile, result.held_step_mape)):
            predicted = predict_records(prof, result.held_keys, settings)
            report = compare_records(held_records, predicted)

            def pct(x: float | None) -> str:
                return "-" if x is None else f"{x:.1f} %"

            table.add_row(label, pct(step_mape), pct(HoldoutReport.mape(report.prefill_duration)),
                          pct(HoldoutReport.mape(report.window_tpot)), pct(HoldoutReport.mape(report.during_tpot)),
                          pct(HoldoutReport.mape(report.baseline_tpot)))
        screen.print(table)
    else:
        screen.print("no configuration held out (--holdout 0): the errors above are in-sample")

    if out is not None:
        named = result.profile.model_copy(update={"name": out.stem})
        atomic_write_text(out, named.to_yaml())
        screen.print(f"fitted profile written: {out} (calibration: calibrated)")


def _settings_of(record: object) -> object:
    from pdexporter.measure.protocol import ProtocolSettings

    c = record.config  # type: ignore[attr-defined]
    return ProtocolSettings(decode_context_tokens=c.decode_context_tokens, decode_output_tokens=c.decode_output_tokens,
                            prefill_max_tokens=c.prefill_max_tokens)
