"""`pdexporter sim`: the embedded engine. `serve` speaks vLLM's (or SGLang's) HTTP API in real time; `calibrate`
fits a profile's step-time parameters to measured records. Thin: the work is in `pdexporter.sim`."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import JustifyMethod
from rich.table import Table

from pdexporter.cli._common import DEFAULT_PROFILE, console, make_console

if TYPE_CHECKING:
    from collections.abc import Callable

    from rich.console import Console

    from pdexporter.measure.protocol import ProtocolSettings
    from pdexporter.measure.records import RunRecord
    from pdexporter.predict.calibrate import Calibration, Generalisation, HoldoutReport
    from pdexporter.sim.profile import Profile

sim_app = typer.Typer(help="The embedded engine (a model of vLLM, or SGLang, on a GPU; no GPU needed).",
                      no_args_is_help=True)


def register(app: typer.Typer) -> None:
    app.add_typer(sim_app, name="sim")


def _line(text: str) -> None:
    sys.stdout.write(text + "\n")
    sys.stdout.flush()


@sim_app.command("serve")
def serve(
    profile: Annotated[
        str | None,
        typer.Option(
            "--profile",
            help="Profile name or YAML path (default: the imitated engine's: "
            f"h200-sglang0.5.15-qwen3-coder-30b-a3b with --engine sglang, else {DEFAULT_PROFILE}).",
        ),
    ] = None,
    chunk_size: Annotated[
        int | None,
        typer.Option(
            "--chunk-size",
            "--max-num-batched-tokens",
            "--chunked-prefill-size",
            "-B",
            min=1,
            help="Token budget per step (tokens; vLLM's --max-num-batched-tokens and SGLang's --chunked-prefill-size "
            "are accepted too: this command stands in for `vllm serve` and SGLang's launch_server).",
        ),
    ] = None,
    engine: Annotated[
        str,
        typer.Option(
            "--engine",
            help="The engine it imitates: vllm (API, metrics, step log, scheduling) or sglang (SGLang "
            "0.5.15's: /server_info, sglang:* metrics, Prefill/Decode batch lines, a chunk before the "
            "paused decodes). docs/engines.md",
        ),
    ] = "vllm",
    enable_mixed_chunk: Annotated[
        bool,
        typer.Option(
            "--enable-mixed-chunk",
            help="With --engine sglang: the decodes join each chunk's step and the chunk "
            "shrinks by their number (SGLang's flag).",
        ),
    ] = False,
    decode_log_interval: Annotated[
        int,
        typer.Option(
            "--decode-log-interval",
            min=1,
            help="With --engine sglang: log every N-th decode step (SGLang's flag; "
            "its default 40; pdexporter needs 1).",
        ),
    ] = 40,
    enable_metrics: Annotated[
        bool,
        typer.Option(
            "--enable-metrics", help="With --engine sglang: serve /metrics (SGLang's flag; vLLM always does)."
        ),
    ] = False,
    max_num_seqs: Annotated[
        int | None, typer.Option("--max-num-seqs", min=1, help="Most requests running at once (vLLM's --max-num-seqs).")
    ] = None,
    long_prefill_token_threshold: Annotated[
        int | None,
        typer.Option(
            "--long-prefill-token-threshold", min=0, help="Cap on one request's tokens per step (tokens; 0: none)."
        ),
    ] = None,
    kv_role: Annotated[
        str,
        typer.Option(
            "--kv-role",
            help="none | decode-bench (every new request's KV filled, 1-token admission) | prefill (answers "
            "kv_transfer_params) | decode (waits for a modelled KV transfer). docs/disaggregation.md",
        ),
    ] = "none",
    host: Annotated[str, typer.Option("--host", help="Address to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option("--port", min=0, max=65535, help="0 picks a free port.")] = 8000,
    ready_file: Annotated[
        Path | None,
        typer.Option(
            "--ready-file", help="Write {url, gpu, version, cuda_graphs, pid} here (atomically) once listening."
        ),
    ] = None,
    otlp_traces_endpoint: Annotated[
        str | None,
        typer.Option(
            "--otlp-traces-endpoint",
            help="Send one vLLM-shaped `llm_request` span per finished request here "
            "(OTLP/HTTP protobuf), as vLLM's flag does.",
        ),
    ] = None,
    host_speed: Annotated[
        str,
        typer.Option(
            "--host-speed",
            help="nominal | slow: the engine core's CPU costs as the profile's nominal host, or x "
            "host.slow_factor (a slow-host episode, docs/sim.md)",
        ),
    ] = "nominal",
) -> None:
    """Serve vLLM's (or SGLang's) OpenAI-compatible API from the embedded engine, in real time. Numbers are modelled."""
    from pdexporter._internal.atomic import atomic_write_json
    from pdexporter._internal.writable import check_writable
    from pdexporter.errors import ConfigError
    from pdexporter.sim.kvconnector import KV_ROLES
    from pdexporter.sim.profile import load_profile
    from pdexporter.sim.server import ServeOptions, precise_event_loop, run_server

    if kv_role not in ("none", *KV_ROLES):
        raise ConfigError(f"--kv-role {kv_role!r}: expected none, {', '.join(KV_ROLES)}")
    if host_speed not in ("nominal", "slow"):
        raise ConfigError(f"--host-speed {host_speed!r}: expected nominal or slow")
    if engine not in ("vllm", "sglang"):
        raise ConfigError(f"--engine {engine!r}: the embedded engine imitates vllm or sglang")
    if engine == "vllm" and enable_mixed_chunk:
        raise ConfigError("--enable-mixed-chunk: an SGLang flag; add --engine sglang")
    if engine != "vllm" and kv_role != "none":
        raise ConfigError(f"--kv-role {kv_role}: the embedded engine models P/D roles imitating vllm only")
    if ready_file is not None:
        check_writable(ready_file, "--ready-file", directory=False)
    imitates = "sglang-mixed" if enable_mixed_chunk else engine
    if profile is None:
        from pdexporter.engines import adapter

        profile = adapter(imitates).sim_profile or DEFAULT_PROFILE
    prof = load_profile(profile)
    if host_speed == "slow":
        prof = prof.on_slow_host()
    options = ServeOptions(chunk_size, max_num_seqs, long_prefill_token_threshold, host, port,
                           None if kv_role == "none" else kv_role,
                           otlp_traces_endpoint=otlp_traces_endpoint, imitates=imitates,
                           decode_log_interval=decode_log_interval if engine != "vllm" else 1,
                           enable_metrics=enable_metrics or engine == "vllm")

    def ready(info: dict[str, object]) -> None:
        role = f", KV role {kv_role}" if kv_role != "none" else ""
        if host_speed == "slow":
            role += f", slow host: CPU x {load_profile(profile).host.slow_factor:.2f}"
        role += f", imitating {imitates}" if imitates != "vllm" else ""
        _line(
            f"INFO pdexporter embedded engine (MODELLED, profile {prof.name}, calibration {prof.calibration}, "
            f"max_num_batched_tokens {info['max_num_batched_tokens']}{role}) serving {info['model']} on {info['url']}"
        )
        _line("INFO Asynchronous scheduling is enabled." if prof.engine.async_scheduling else
              "INFO Asynchronous scheduling is disabled.")
        if ready_file is not None:
            atomic_write_json(ready_file, info)

    with asyncio.Runner(loop_factory=precise_event_loop) as runner:
        runner.run(run_server(prof, options, on_ready=ready, log=_line))
    _line("INFO embedded engine stopped")


@sim_app.command("profiles")
def profiles() -> None:
    """List the profiles a --profile name finds (shipped, then the user's: $PDEXPORTER_PROFILES or
    ~/.config/pdexporter/profiles) and how their parameters were obtained (projected or calibrated)."""
    from rich.table import Table

    from pdexporter.errors import ConfigError
    from pdexporter.sim.profile import list_profiles, load_profile, user_profile_dirs

    out = make_console()

    table = Table(title="embedded-engine profiles (calibrated: fitted to measurements; projected: from shapes "
                        "and datasheets, never measured)")
    for col in ("name", "origin", "GPU", "model", "calibration", "file"):
        table.add_column(col, overflow="fold")
    seen: set[str] = set()
    for entry in list_profiles():
        shadowed = entry.name in seen
        seen.add(entry.name)
        try:
            prof = load_profile(entry.path)
        except ConfigError as exc:
            table.add_row(entry.name, entry.origin, "-", "-", f"[red]unreadable[/]: {exc}", str(entry.path))
            continue
        origin = entry.origin + (" (shadowed by the built-in)" if shadowed else "")
        table.add_row(entry.name, origin, prof.gpu.name, prof.model.name, prof.calibration, str(entry.path))
    out.print(table)
    out.print("user profiles: " + ", ".join(str(d) for d in user_profile_dirs())
                  + " (`pdexporter sim profile-from-config` writes there by default)")


@sim_app.command("profile-from-config")
def profile_from_config_cmd(
    config: Annotated[
        str,
        typer.Argument(
            help="A Hugging Face config.json (or the folder holding it), or a shipped one by name: "
            "llama-3.1-8b-instruct, qwen3-8b, qwen3-coder-30b-a3b, mixtral-8x7b-instruct, deepseek-v2-lite-chat."
        ),
    ],
    gpu: Annotated[str, typer.Option("--gpu", help="H200, H100, H20, A100 or L40S (datasheet figures).")] = "H200",
    out: Annotated[
        Path | None,
        typer.Option(
            "--out", help="Write the profile here (default: <user profile dir>/<name>.yaml, found by --profile NAME)."
        ),
    ] = None,
    name: Annotated[str | None, typer.Option("--name", help="Profile name (default: <gpu>-<model>).")] = None,
    model_name: Annotated[
        str | None,
        typer.Option(
            "--served-model-name", help="Model name the engine serves (default: the config's folder or file name)."
        ),
    ] = None,
    max_model_len: Annotated[
        int | None,
        typer.Option(
            "--max-model-len",
            min=1,
            help="Tokens (default: the config's max_position_embeddings, at most the KV capacity).",
        ),
    ] = None,
    chunk_size: Annotated[
        int, typer.Option("--chunk-size", "-B", min=1, help="Default max_num_batched_tokens (tokens).")
    ] = 8192,
    dummy_weights: Annotated[
        bool,
        typer.Option(
            "--dummy-weights",
            help="Route generated tokens as vLLM's --load-format dummy weights do (a few experts), "
            "for comparing with a dummy-weight sweep; default: real weights' routing.",
        ),
    ] = False,
    carry_from: Annotated[
        str | None,
        typer.Option("--from", help="Calibrated reference profile(s), comma-separated, the projection learns from "
                     "(default: the shipped calibrated vLLM profiles, the MoE one first: its host costs are carried)."),
    ] = None,
    rule: Annotated[
        str,
        typer.Option("--rule", help="learned: each parameter from the references of what it prices (docs/sim.md); "
                     "carry: the first reference's efficiencies, layer costs scaled by layers (before issue 36)."),
    ] = "learned",
) -> None:
    """Project a profile for a model on a GPU from its config.json: shapes from the config, peaks from the
    datasheet, efficiencies and host costs carried over from a calibrated profile. Numbers are a projection."""
    from rich.table import Table

    from pdexporter._internal.atomic import atomic_write_text
    from pdexporter._internal.writable import check_writable
    from pdexporter.sim.modelconfig import load_config, profile_from_config
    from pdexporter.sim.profile import user_profile_dirs
    from pdexporter.sim.steptime import StepComposition, StepTimeModel

    if out is not None:
        check_writable(out, directory=False)
    data, source = load_config(config)
    src = Path(source)
    served = model_name or (src.parent.name if src.name == "config.json" else src.stem)
    prof = profile_from_config(data, gpu, name=name or (out.stem if out is not None else None), model_name=served,
                               source=source, carry_from=carry_from.split(",") if carry_from else None,
                               max_model_len=max_model_len, max_num_batched_tokens=chunk_size,
                               dummy_weights=dummy_weights, rule=rule)
    target = check_writable(out or user_profile_dirs()[0] / f"{prof.name}.yaml", "--out" if out else "output",
                            directory=False)
    target.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(target, prof.to_yaml())
    m, e = prof.model, prof.engine
    console = make_console()  # the result: stdout
    console.print(
        f"[bold]{prof.name}[/]: calibration [yellow]{prof.calibration.upper()}[/] (never measured) -> {target}"
    )
    console.print(f"  {m.architecture}: {m.num_layers} layers, {m.total_params / 1e9:.2f} B parameters "
                  f"({m.active_params / 1e9:.2f} B active), {m.weights_bytes / 2**30:.1f} GiB of weights, "
                  f"KV {m.kv_bytes_per_token / 1024:g} KiB a token, capacity {e.kv_capacity_tokens:,} tokens, "
                  f"max_model_len {e.max_model_len:,}")
    table = Table(title="where each part comes from")
    table.add_column("part")
    table.add_column("source")
    for part, text in prof.provenance.items():
        table.add_row(part, text)
    console.print(table)
    model = StepTimeModel(prof, max_num_batched_tokens=chunk_size)
    ctx = 4096
    steps = Table(title=f"projected step times at B={chunk_size} (MODELLED, ms)")
    for col in ("step", "GPU", "CPU", "graph"):
        steps.add_column(col, justify="right" if col != "step" else "left")
    for label, comp in (
        *((f"decode D={d} at {ctx} tokens", StepComposition.decode_batch(d, ctx)) for d in (1, 8, 32)),
        (f"prefill chunk {chunk_size - 8} + 8 decodes", StepComposition.of([(chunk_size - 8, 0)] + [(1, ctx)] * 8)),
    ):
        b = model.breakdown(comp)
        steps.add_row(label, f"{b.gpu_s * 1e3:.2f}", f"{b.cpu_s * 1e3:.2f}", f"{b.graph_mode} ({b.padded_tokens})")
    console.print(steps)
    console.print(f"use it: pdexporter sim serve --profile {prof.name if out is None else target}; calibrate it with "
                  "a short sweep of the model on the GPU (docs/sim.md, 'Calibrating a new model')")


@sim_app.command("calibrate")
def calibrate_cmd(  # noqa: C901 (26: to shrink)
    results_dir: Annotated[Path, typer.Argument(help="A results directory: {chunk}/D{d}_P{p}.json records.")],
    profile: Annotated[str, typer.Option("--profile", help="Base profile (its GPU, model, engine).")] = DEFAULT_PROFILE,
    out: Annotated[Path | None, typer.Option("--out", help="Write the fitted profile (YAML) here.")] = None,
    holdout: Annotated[
        float,
        typer.Option(
            "--holdout", min=0.0, max=0.9, help="Fraction of configurations kept out of the fit and predicted."
        ),
    ] = 0.2,
    train_grid: Annotated[
        Path | None,
        typer.Option(
            "--train-grid",
            help="Fit on the configurations of this sweep file's grid (e.g. sweeps/calibrate-short.yaml) "
            "and predict every other record (replaces --holdout).",
        ),
    ] = None,
    train_reps: Annotated[
        int | None,
        typer.Option(
            "--train-reps",
            min=1,
            help="Fit on the first N repetitions of each training record only (what a shorter "
            "sweep would have measured).",
        ),
    ] = None,
    also_predict: Annotated[
        list[Path] | None,
        typer.Option(
            "--also-predict",
            help="Another results directory to predict with the fitted profile (configurations of "
            "another run; repeatable).",
        ),
    ] = None,
    tolerance: Annotated[
        float,
        typer.Option(
            "--tolerance",
            min=0.0,
            help="A fit is refused when it predicts the held-out configurations worse than the "
            "base by more than this (points of MAPE).",
        ),
    ] = 1.0,
    free: Annotated[
        str | None,
        typer.Option(
            "--free", help="Comma-separated parameters to fit (default: the GPU's, then the CPU's and the loop's)."
        ),
    ] = None,
    rounds: Annotated[
        int, typer.Option("--rounds", min=1, max=10, help="Alternations of the step fit and the engine-loop fit.")
    ] = 2,
    max_evaluations: Annotated[
        int,
        typer.Option(
            "--max-evaluations",
            min=1,
            help="Simulated sweeps per engine-loop fit, its finite differences included (each predicts every "
            "training point).",
        ),
    ] = 24,
    jobs: Annotated[
        int, typer.Option("--jobs", "-j", min=0, help="Worker processes for the simulations (0: one per CPU).")
    ] = 0,
    generalisation: Annotated[
        bool,
        typer.Option("--generalisation", help="Also refit with each chunk size and each D left out and predict it."),
    ] = False,
    accept_worse: Annotated[
        bool,
        typer.Option(
            "--force",
            "--accept-worse",
            help="Write the fit even if it predicts the held-out configurations worse than the base on a quantity "
            "(labelled calibrated-worse-than-base, calibration_check.forced; the output says so).",
        ),
    ] = False,
    report: Annotated[
        Path | None,
        typer.Option(
            "--report", help="Write every figure (parameters, fit errors, held-out errors per configuration) as JSON."
        ),
    ] = None,
) -> None:
    """Fit a profile to measured records and report the emulator's error on held-out configurations."""
    import os
    import time

    from pdexporter._internal.atomic import atomic_write_json, atomic_write_text
    from pdexporter._internal.writable import check_writable
    from pdexporter.errors import ConfigError, RecordError
    from pdexporter.measure.records import aggregate
    from pdexporter.measure.store import ResultsStore
    from pdexporter.predict.calibrate import (
        BOUNDS,
        DEFAULT_FREE,
        HEADLINE,
        METRIC_LABELS,
        METRICS,
        RecordSimulator,
        calibrate,
        compare_records,
        decode_table,
        figures_of,
        forced_warning,
        free_for,
        held_out_check,
        host_states,
        profile_to_write,
        refusal,
        worse_of,
    )
    from pdexporter.predict.calibrate import generalisation as leave_one_out
    from pdexporter.sim.profile import load_profile

    started = time.perf_counter()
    screen = make_console()
    names = [f.strip() for f in free.split(",") if f.strip()] if free else list(DEFAULT_FREE)
    unknown = [n for n in names if n not in BOUNDS]
    if unknown:
        raise ConfigError(f"--free {','.join(unknown)}: unknown parameter; fittable: {', '.join(sorted(BOUNDS))}")
    if not results_dir.is_dir():
        raise ConfigError(f"RESULTS_DIR {results_dir}: not a directory")
    for flag, path in (("--out", out), ("--report", report)):
        if path is not None:
            check_writable(path, flag, directory=False)
    base = load_profile(profile)
    names = list(free_for(base, names))  # a dense model: its GEMM efficiency in place of the experts'
    records = list(ResultsStore(results_dir).iter_records())
    if not records:
        raise RecordError(f"{results_dir}: no records (expected {{chunk}}/D{{d}}_P{{p}}.json)")
    train_keys = None
    if train_grid is not None:
        from pdexporter.sweep.spec import load_sweep

        wanted = set(load_sweep(train_grid).points())
        train_keys = {r.key for r in records if r.key in wanted}
        if not train_keys:
            raise ConfigError(f"--train-grid {train_grid}: none of its configurations is among the records of "
                              f"{results_dir}")
    if train_reps is not None:
        fitted_keys = train_keys if train_keys is not None else {r.key for r in records}
        records = [aggregate(r.config, r.reps[:train_reps]) if r.key in fitted_keys and len(r.reps) > train_reps
                   else r for r in records]
    extra: list[tuple[Path, list[RunRecord]]] = []
    for directory in also_predict or []:
        if not directory.is_dir():
            raise ConfigError(f"--also-predict {directory}: not a directory")
        others = list(ResultsStore(directory).iter_records())
        if not others:
            raise RecordError(f"--also-predict {directory}: no records")
        extra.append((directory, others))
    bar = _CalibrationBar(console)
    with bar:
        modelled = sum(1 for r in records if r.config.modelled)
        if modelled:
            bar.note(f"[yellow]{modelled} of {len(records)} records are MODELLED (embedded engine): fitting a model "
                     "to a model's output only checks the fitting.[/]")
        gpus = sorted({r.config.gpu for r in records})
        if gpus != [base.gpu.name]:
            bar.note(f"[yellow]records are from GPU {', '.join(gpus)}; the base profile is for {base.gpu.name}[/]")
        modes = sorted({r.config.mode for r in records})
        mode = "fast" if modes == ["fast"] else "faithful"
        workers = jobs or min(8, len(os.sched_getaffinity(0)))
        simulator = RecordSimulator([r.key for r in records], _settings_of(records[0]), mode=mode, jobs=workers,
                                    on_group=lambda g: bar.advance(1))
        try:
            with simulator:
                result = calibrate(base, records, holdout=holdout, train_keys=train_keys, free=names,
                                   source=str(results_dir), simulate=simulator, rounds=rounds,
                                   max_evaluations=max_evaluations, progress=bar,
                                   on_evaluation=lambda r, i, rms: bar.info(f"sweep {i}: rms log {rms:.3f}"))
                loo = leave_one_out(result, records, simulator, free=names, progress=bar) if generalisation else None
            predicted_extra = []
            for directory, others in extra:
                bar.stage(f"predicting {directory}")
                with RecordSimulator([r.key for r in others], _settings_of(others[0]), mode=mode,
                                     jobs=workers) as other:
                    measured = figures_of(others)
                    base_pred, fitted_pred = other([base, result.profile], list(measured))
                    slow, _, _, _ = host_states(result.profile, measured, other)
                predicted_extra.append((directory, compare_records(measured, base_pred),
                                        compare_records(measured, fitted_pred), slow))
        except ValueError as exc:
            raise ConfigError(f"calibrate {results_dir}: {exc}") from exc
        bar.stage("done")

    _print_calibration(screen, base, result, names, mode)
    for directory, rep_base, rep_fit, slow in predicted_extra:
        _print_extra(screen, directory, rep_base, rep_fit, slow, results_dir)
    decode_rows = decode_table({"base": base, "fitted": result.profile}, records)
    _print_decode_table(screen, decode_rows)
    if loo is not None:
        _print_generalisation(screen, loo, HEADLINE, METRIC_LABELS)
    timings = {**result.timings, **({"generalisation": loo.seconds} if loo is not None else {}),
               "wall": time.perf_counter() - started}
    screen.print(f"wall {timings['wall']:.1f} s ({workers} worker process(es), {simulator.simulated} (B, D) groups "
                 f"simulated, {simulator.cpu_s:.0f} s of simulation CPU): "
                 + ", ".join(f"{k} {v:.1f} s" for k, v in timings.items() if k not in ("wall", "total", "split")))

    worse = worse_of(check := held_out_check(result, tolerance))  # the fit against its base, per quantity
    payload: dict[str, object] = {
        "results_dir": str(results_dir),
        "base_profile": base.name,
        "holdout": holdout,
        "mode": mode,
        "train_grid": str(train_grid) if train_grid is not None else None,
        "train_reps": train_reps,
        "tolerance": tolerance,
        "host": result.profile.host.model_dump(),
        "slow_host_train": sorted(map(list, result.slow_keys)),
        "slow_host_held_out": sorted(map(list, result.held_slow)),
        "free": names,
        "rounds": result.rounds,
        "max_evaluations": max_evaluations,
        "jobs": workers,
        "parameters": {
            f"{section}.{name}": value
            for section in ("step_time", "engine_loop", "host")
            for name, value in getattr(result.profile, section).model_dump().items()
        },
        "base_parameters": {
            f"{section}.{name}": value
            for section in ("step_time", "engine_loop", "host")
            for name, value in getattr(base, section).model_dump().items()
        },
        "train_configurations": sorted(map(list, result.train_keys)),
        "held_out_configurations": sorted(map(list, result.held_keys)),
        "stage1": {
            "n": result.fit.n,
            "mape": result.fit.mape,
            "by_kind": result.fit.by_kind,
            "base_mape": result.before[0],
            "base_by_kind": result.before[3],
            "held_out_mape": result.held_step_mape,
            "held_out_base_mape": result.held_step_mape_before,
        },
        "stage2": None if result.loop is None else {"rms_log": result.loop.rms_log, "evaluations": result.simulations},
        "decode_steps": decode_rows,
        "timings_s": timings,
        "simulated_groups": simulator.simulated,
        "simulation_cpu_s": simulator.cpu_s,
        "worse_than_base": [{"metric": m, "fitted": f, "base": b} for m, f, b in worse],
        "calibration_check": check.model_dump(mode="json"),
    }
    for label, held in (("base", result.held_base), ("fitted", result.held_fitted),
                        ("fitted_host_matched", result.held_fitted_host)):
        if held is not None:
            mapes = held.table()
            payload[f"held_out_{label}"] = {
                "mape": mapes, "by_kind": held.by_kind(),
                "points": {m: [{"key": list(e.key), "measured": e.measured, "predicted": e.predicted}
                               for e in held.of(m)] for m in mapes},
            }
    if result.held_fitted is not None:
        payload["held_out_fitted"]["mape_nominal_host"] = {m: result.nominal_mape(m) for m in METRICS}  # type: ignore[index]
    payload["also_predicted"] = [
        {"results_dir": str(d), "base": b.table(), "fitted": f.table(), "slow_host": sorted(map(list, slow)),
         "fitted_nominal_host": {m: f.metric_mape(m, where=_outside(slow)) for m in METRICS}}
        for d, b, f, slow in predicted_extra]
    if loo is not None:
        payload["generalisation"] = {"groups": loo.table(), "simulated_groups": loo.simulations,
                                     "seconds": loo.seconds}

    written = None
    if out is not None and (not worse or accept_worse):
        named = profile_to_write(result.profile, check, force=accept_worse).model_copy(update={"name": out.stem})
        atomic_write_text(out, named.to_yaml())
        written = str(out)
        screen.print(f"fitted profile written: {out} (calibration: {named.calibration})")
        if worse:
            screen.print(f"[bold yellow]{forced_warning(check)}[/]")
    payload["written"] = written
    if report is not None:
        atomic_write_json(report, payload)
        screen.print(f"report written: {report}")
    if not result.held_keys:
        screen.print("no configuration held out (--holdout 0): the errors above are in-sample and the fit was not "
                     "checked against the base profile")
    screen.print(f"calibrated in {timings['wall']:.0f} s" + (f" -> {out}" if written else ""))
    if worse and not accept_worse:
        raise refusal(check, out=out)


class _CalibrationBar:
    """One rich progress bar across every stage of `sim calibrate` (`pdexporter.predict.calibrate.Progress`):
    its total grows as stages plan their work (simulated (B, D) groups) and shrinks when a stage
    ends under budget, so the ETA covers the whole run. Off a terminal, one line per stage."""

    def __init__(self, console: Console) -> None:
        from rich.progress import (
            BarColumn,
            Progress,
            TaskProgressColumn,
            TextColumn,
            TimeElapsedColumn,
            TimeRemainingColumn,
        )

        self.console = console
        self.progress = Progress(TextColumn("[progress.description]{task.description}"), BarColumn(),
                                 TaskProgressColumn(), TextColumn("{task.fields[info]}"), TimeElapsedColumn(),
                                 TextColumn("ETA"), TimeRemainingColumn(), console=console,
                                 transient=True)
        self.task = self.progress.add_task("calibrate", total=0.0, info="")
        self.live = console.is_terminal

    def __enter__(self) -> _CalibrationBar:
        if self.live:
            self.progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.live:
            self.progress.stop()

    def plan(self, units: float) -> None:
        task = self.progress.tasks[0]
        self.progress.update(self.task, total=max(task.completed, (task.total or 0.0) + units))

    def stage(self, name: str) -> None:
        self.progress.update(self.task, description=name)
        if not self.live:
            task = self.progress.tasks[0]
            eta = task.time_remaining
            self.console.print(f"calibrate: {name} (at {task.elapsed or 0.0:.0f} s, {task.percentage:.0f} %"
                               + (f", ETA {eta:.0f} s)" if eta is not None else ")"))

    def advance(self, units: float, info: str = "") -> None:
        if info:
            self.progress.update(self.task, advance=units, info=info)
        else:
            self.progress.update(self.task, advance=units)

    def info(self, text: str) -> None:
        self.progress.update(self.task, info=text)

    def note(self, text: str) -> None:
        self.console.print(text)


def _print_calibration(screen: Console, base: Profile, result: Calibration, names: list[str], mode: str) -> None:

    params = Table(title=f"{base.name}: parameters (* fitted)")
    params.add_column("parameter")
    params.add_column("base", justify="right")
    params.add_column("fitted", justify="right")
    for section in ("step_time", "engine_loop", "host"):
        old = getattr(base, section).model_dump()
        new = getattr(result.profile, section).model_dump()
        for name in new:
            mark = " *" if name in names else ""
            params.add_row(f"{section}.{name}{mark}", f"{old[name]}",
                           f"{new[name]:.4g}" if isinstance(new[name], float) else f"{new[name]}")
    screen.print(params)

    fit = Table(title="stage 1: step times of the training configurations (decode steps, middle chunks)")
    justify: JustifyMethod
    for col, justify in (
        ("profile", "left"),
        ("n", "right"),
        ("MAPE", "right"),
        ("worst", "right"),
        ("by kind", "left"),
    ):
        fit.add_column(col, justify=justify)
    b_mape, _, b_max, b_kinds = result.before
    r = result.fit
    fit.add_row(
        "base", str(r.n), f"{b_mape:.1f} %", f"{b_max:.1f} %", ", ".join(f"{k} {v:.1f} %" for k, v in b_kinds.items())
    )
    fit.add_row("fitted", str(r.n), f"{r.mape:.1f} %", f"{r.max_ape:.1f} %",
                ", ".join(f"{k} {v:.1f} %" for k, v in r.by_kind.items()))
    screen.print(fit)
    train = result.train
    screen.print(f"training: {len(result.train_keys)} configurations, {train.reps_used} reps with every "
                 f"chunk seen, {train.reps_mismatched} reps whose chunk steps did not match their chunks "
                 "(decode step only)")
    loop = result.loop
    if loop is not None:
        screen.print(f"stage 2 (engine loop, by simulation in {mode} mode): {loop.n_configs} configurations, "
                     f"{loop.n_residuals} residuals, rms log error {loop.rms_log:.3f} after "
                     f"{result.simulations} simulated sweeps ({loop.message})")
    from pdexporter.predict.calibrate import HEADLINE, METRIC_LABELS, METRICS

    for label, held in (("base", result.held_base), ("fitted", result.held_fitted)):
        if held is None:
            continue
        table = Table(title=f"{label} profile: MAPE on the {len(result.held_keys)} held-out configurations of the "
                            "SAME campaign as the fit (another campaign's error: --also-predict DIR) (predicted by "
                            f"running the protocol on the embedded engine, {mode} mode, nominal host)")
        table.add_column("metric")
        mapes = held.table()
        chunks = [k for k in mapes["prefill_duration"] if k != "all"]
        for c in chunks:
            table.add_column(f"B={c}", justify="right")
        table.add_column("all", justify="right")
        host = label == "fitted" and bool(result.sensitive_keys or result.held_slow)
        if host:
            n_nominal = len(result.held_keys - result.held_slow)
            table.add_column(f"nominal host ({n_nominal})", justify="right")
            table.add_column("host-matched", justify="right")
        for metric in METRICS:
            cells = [_pct(mapes[metric].get(c)) for c in chunks] + [_pct(mapes[metric]["all"])]
            if host:
                matched = result.held_fitted_host.metric_mape(metric) if result.held_fitted_host else None
                cells += [_pct(result.nominal_mape(metric)), _pct(matched)]
            table.add_row(METRIC_LABELS[metric], *cells)
        screen.print(table)
        kinds = Table(title=f"{label} profile: held-out MAPE by kind of configuration")
        kinds.add_column("configurations")
        kinds.add_column("n", justify="right")
        for metric in HEADLINE:
            kinds.add_column(METRIC_LABELS[metric], justify="right")
        for kind, row in held.by_kind().items():
            kinds.add_row(kind, str(row["n"]), *[_pct(row[m]) for m in HEADLINE])
        screen.print(kinds)
    if result.sensitive_keys or result.held_slow:
        h = result.profile.host
        screen.print(f"host: {len(result.slow_keys)} of the {len(result.sensitive_keys)} training configurations the "
                     f"host's speed moves ran in a slow-host episode (CPU x {h.slow_factor:.2f}: slow_fraction "
                     f"{h.slow_fraction:.2f}); held out: {len(result.held_slow)} of {len(result.held_keys)}. The "
                     "prediction is the nominal host's; 'host-matched' predicts each configuration on the host it "
                     "ran on (MODELLED distribution, docs/sim.md)")


def _outside(keys: set) -> Callable[[tuple[int, int, int]], bool]:
    return lambda key: key not in keys


def campaign_words(directory: Path, fitted_on: Path | None = None) -> str:
    """Which GPU campaign a results directory is (its campaign.yaml), and whether it is the one the
    fit read: an error on the same campaign is not a held-out-campaign error (docs/analysis.md)."""
    from pdexporter.analysis.campaigns import load_campaign

    info = load_campaign(directory)
    if info is None:
        return "campaign unnamed (no campaign.yaml)"
    if fitted_on is None:
        return f"campaign {info['id']}"
    fit = load_campaign(fitted_on)
    same = fit is not None and fit["id"] == info["id"]
    return f"campaign {info['id']}: {'the SAME campaign as the fit' if same else 'a campaign the fit never read'}"


def _print_extra(screen: Console, directory: Path, base: HoldoutReport, fitted: HoldoutReport, slow: set,
                 fitted_on: Path) -> None:
    from pdexporter.predict.calibrate import METRIC_LABELS, METRICS

    n = len({e.key for m in METRICS for e in fitted.of(m)})
    table = Table(title=f"{directory} ({campaign_words(directory, fitted_on)}): MAPE on its {n} configurations "
                        "(none in the fit; nominal host)")
    for col in ("metric", "base", "fitted", f"fitted, nominal host ({n - len(slow)})"):
        table.add_column(col, justify="left" if col == "metric" else "right")
    for metric in METRICS:
        table.add_row(METRIC_LABELS[metric], _pct(base.metric_mape(metric)), _pct(fitted.metric_mape(metric)),
                      _pct(fitted.metric_mape(metric, where=_outside(slow))))
    screen.print(table)


def _print_decode_table(screen: Console, rows: list[dict[str, object]]) -> None:

    table = Table(title="decode steps on and between the grid's D (MODELLED: steady-state step at the baseline "
                        "context; measured: median baseline TPOT over chunk sizes)")
    for col in ("D", "graph", "base ms", "fitted ms", "measured ms", "same graph: D / measured ms", "known ms"):
        table.add_column(col, justify="right")
    for r in rows:
        same = f"{r['same_graph_D']} / {r['same_graph_measured_ms']:.2f}" if r["same_graph_D"] is not None else "-"
        table.add_row(str(r["D"]), str(r["padded"]), f"{r['base_ms']:.2f}", f"{r['fitted_ms']:.2f}",
                      f"{r['measured_ms']:.2f}" if r["measured_ms"] is not None else "-", same,
                      f"{r['known_ms']:.1f}" if r["known_ms"] is not None else "-")
    screen.print(table)


def _print_generalisation(screen: Console, loo: Generalisation, headline: tuple[str, ...], labels: dict[str, str]
                          ) -> None:

    table = Table(title="generalisation: MAPE on the group left out, refitted without it (base profile in brackets)")
    table.add_column("left out")
    table.add_column("n", justify="right")
    for metric in headline:
        table.add_column(labels[metric], justify="right")
    for g in loo.groups:
        table.add_row(f"{g.by}={g.value}", str(g.n_configs),
                      *[f"{_pct(g.fitted[m])} ({_pct(g.base[m])})" for m in headline])
    screen.print(table)


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{x:.1f} %"


def _settings_of(record: RunRecord) -> ProtocolSettings:
    from pdexporter.measure.protocol import ProtocolSettings

    c = record.config
    return ProtocolSettings(decode_context_tokens=c.decode_context_tokens, decode_output_tokens=c.decode_output_tokens,
                            prefill_max_tokens=c.prefill_max_tokens)


def _register_sweep() -> None:
    """`pdexporter sim sweep`: the sweep controller on the embedded engine's virtual clock."""
    from pdexporter.cli.sweep import sim_sweep

    sim_app.command("sweep")(sim_sweep)


_register_sweep()
