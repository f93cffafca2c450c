"""`pdexporter sim`: the embedded engine. `serve` speaks vLLM's (or SGLang's) HTTP API in real time; `calibrate`
fits a profile's step-time parameters to measured records. Thin: the work is in `pdexporter.sim` and
`pdexporter.predict.calibrate_job`."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from pdexporter.cli._common import DEFAULT_PROFILE, console, make_console, show
from pdexporter.cli._sweeping import ChunkIndexOpt, ModeOpt, RepsOpt, SweepFileArg, sweep_and_report
from pdexporter.engines import DEFAULT_CHUNK_SIZE, DEFAULT_ENGINE

if TYPE_CHECKING:
    from rich.console import Console

sim_app = typer.Typer(help="The embedded engine (a model of vLLM, or SGLang, on a GPU; no GPU needed).",
                      no_args_is_help=True)


def register(app: typer.Typer) -> None:
    app.add_typer(sim_app, name="sim")


def _line(text: str) -> None:
    sys.stdout.write(text + "\n")
    sys.stdout.flush()


@sim_app.command("serve")
def serve(
    profile: Annotated[str | None, typer.Option(
        "--profile", help="Profile name or YAML path (default: the imitated engine's: "
        f"h200-sglang0.5.15-qwen3-coder-30b-a3b with --engine sglang, else {DEFAULT_PROFILE}).")] = None,
    chunk_size: Annotated[int | None, typer.Option(
        "--chunk-size", "--max-num-batched-tokens", "--chunked-prefill-size", "-B", min=1,
        help="Token budget per step (tokens; vLLM's --max-num-batched-tokens and SGLang's --chunked-prefill-size "
        "are accepted too: this command stands in for `vllm serve` and SGLang's launch_server).")] = None,
    engine: Annotated[str, typer.Option(
        "--engine", help="The engine it imitates: vllm (API, metrics, step log, scheduling) or sglang (SGLang "
        "0.5.15's: /server_info, sglang:* metrics, Prefill/Decode batch lines, a chunk before the "
        "paused decodes). docs/engines.md")] = DEFAULT_ENGINE,
    enable_mixed_chunk: Annotated[bool, typer.Option(
        "--enable-mixed-chunk", help="With --engine sglang: the decodes join each chunk's step and the chunk "
        "shrinks by their number (SGLang's flag).")] = False,
    decode_log_interval: Annotated[int, typer.Option(
        "--decode-log-interval", min=1, help="With --engine sglang: log every N-th decode step (SGLang's flag; "
        "its default 40; pdexporter needs 1).")] = 40,
    enable_metrics: Annotated[bool, typer.Option(
        "--enable-metrics", help="With --engine sglang: serve /metrics (SGLang's flag; vLLM always does).")] = False,
    max_num_seqs: Annotated[int | None, typer.Option(
        "--max-num-seqs", min=1, help="Most requests running at once (vLLM's --max-num-seqs).")] = None,
    long_prefill_token_threshold: Annotated[int | None, typer.Option(
        "--long-prefill-token-threshold", min=0, help="Cap on one request's tokens per step (tokens; 0: none).")
    ] = None,
    kv_role: Annotated[str, typer.Option(
        "--kv-role", help="none | decode-bench (every new request's KV filled, 1-token admission) | prefill (answers "
        "kv_transfer_params) | decode (waits for a modelled KV transfer). docs/disaggregation.md")] = "none",
    host: Annotated[str, typer.Option("--host", help="Address to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option("--port", min=0, max=65535, help="0 picks a free port.")] = 8000,
    ready_file: Annotated[Path | None, typer.Option(
        "--ready-file", help="Write {url, gpu, version, cuda_graphs, pid} here (atomically) once listening.")] = None,
    otlp_traces_endpoint: Annotated[str | None, typer.Option(
        "--otlp-traces-endpoint", help="Send one vLLM-shaped `llm_request` span per finished request here "
        "(OTLP/HTTP protobuf), as vLLM's flag does.")] = None,
    host_speed: Annotated[str, typer.Option(
        "--host-speed", help="nominal | slow | switching: the engine core's CPU costs as the profile's nominal "
        "host, x host.slow_factor (a slow-host episode), or switching between the two in episodes of seconds, "
        "slow host.slow_fraction of the time (the engine state GPU session 37 measured; docs/sim.md)")] = "nominal",
) -> None:
    """Serve vLLM's (or SGLang's) OpenAI-compatible API from the embedded engine, in real time. Numbers are modelled."""
    options = dict(locals())
    from pdexporter.sim.serving import serve_embedded

    serve_embedded(**options, log=_line, default_profile=DEFAULT_PROFILE)


@sim_app.command("profiles")
def profiles() -> None:
    """List the profiles a --profile name finds (shipped, then the user's: $PDEXPORTER_PROFILES or
    ~/.config/pdexporter/profiles) and how their parameters were obtained (projected or calibrated)."""
    from pdexporter.sim.catalogue import profiles_sheet

    show(profiles_sheet(), make_console())


@sim_app.command("profile-from-config")
def profile_from_config_cmd(
    config: Annotated[str, typer.Argument(
        help="A Hugging Face config.json (or the folder holding it), or a shipped one by name: "
        "llama-3.1-8b-instruct, llama-3.2-1b-instruct, llama-3.2-3b-instruct, qwen2.5-7b-instruct, qwen3-4b, "
        "qwen3-8b, qwen3-14b, qwen2.5-32b-instruct, qwen3-coder-30b-a3b, mixtral-8x7b-instruct, "
        "deepseek-v2-lite-chat.")],
    gpu: Annotated[str, typer.Option("--gpu", help="H200, H100, H20, A100 or L40S (datasheet figures).")] = "H200",
    out: Annotated[Path | None, typer.Option(
        "--out", help="Write the profile here (default: <user profile dir>/<name>.yaml, found by --profile NAME).")
    ] = None,
    name: Annotated[str | None, typer.Option("--name", help="Profile name (default: <gpu>-<model>).")] = None,
    model_name: Annotated[str | None, typer.Option(
        "--served-model-name", help="Model name the engine serves (default: the config's folder or file name).")
    ] = None,
    max_model_len: Annotated[int | None, typer.Option(
        "--max-model-len", min=1, help="Tokens (default: the config's max_position_embeddings, at most the KV "
        "capacity).")] = None,
    chunk_size: Annotated[int, typer.Option(
        "--chunk-size", "-B", min=1, help="Default max_num_batched_tokens (tokens).")] = DEFAULT_CHUNK_SIZE,
    dummy_weights: Annotated[bool, typer.Option(
        "--dummy-weights", help="Route generated tokens as vLLM's --load-format dummy weights do (a few experts), "
        "for comparing with a dummy-weight sweep; default: real weights' routing.")] = False,
    carry_from: Annotated[str | None, typer.Option(
        "--from", help="Calibrated reference profile(s), comma-separated, the projection learns from (default: the "
        "shipped calibrated vLLM profiles, the MoE one first: its host costs are carried).")] = None,
    rule: Annotated[str, typer.Option(
        "--rule", help="learned: each parameter from the references of what it prices (docs/sim.md); carry: the "
        "first reference's efficiencies, layer costs scaled by layers (before issue 36).")] = "learned",
) -> None:
    """Project a profile for a model on a GPU from its config.json: shapes from the config, peaks from the
    datasheet, efficiencies and host costs carried over from a calibrated profile. Numbers are a projection."""
    options = dict(locals())
    from pdexporter.sim.catalogue import project_profile

    show(project_profile(**options), make_console())  # the result: stdout


@sim_app.command("calibrate")
def calibrate_cmd(
    results_dir: Annotated[Path, typer.Argument(help="A results directory: {chunk}/D{d}_P{p}.json records.")],
    profile: Annotated[str, typer.Option("--profile", help="Base profile (its GPU, model, engine).")] = DEFAULT_PROFILE,
    out: Annotated[Path | None, typer.Option("--out", help="Write the fitted profile (YAML) here.")] = None,
    holdout: Annotated[float, typer.Option(
        "--holdout", min=0.0, max=0.9, help="Fraction of configurations kept out of the fit and predicted.")] = 0.2,
    train_grid: Annotated[Path | None, typer.Option(
        "--train-grid", help="Fit on the configurations of this sweep file's grid (e.g. sweeps/calibrate-short.yaml) "
        "and predict every other record (replaces --holdout).")] = None,
    train_reps: Annotated[int | None, typer.Option(
        "--train-reps", min=1, help="Fit on the first N repetitions of each training record only (what a shorter "
        "sweep would have measured).")] = None,
    also_predict: Annotated[list[Path] | None, typer.Option(
        "--also-predict", help="Another results directory to predict with the fitted profile (configurations of "
        "another run; repeatable).")] = None,
    tolerance: Annotated[float, typer.Option(
        "--tolerance", min=0.0, help="A fit is refused when it predicts the held-out configurations worse than the "
        "base by more than this (points of MAPE).")] = 1.0,
    free: Annotated[str | None, typer.Option(
        "--free", help="Comma-separated parameters to fit (default: the GPU's, then the CPU's and the loop's).")
    ] = None,
    rounds: Annotated[int, typer.Option(
        "--rounds", min=1, max=10, help="Alternations of the step fit and the engine-loop fit.")] = 2,
    max_evaluations: Annotated[int, typer.Option(
        "--max-evaluations", min=1, help="Simulated sweeps per engine-loop fit, its finite differences included "
        "(each predicts every training point).")] = 24,
    jobs: Annotated[int, typer.Option(
        "--jobs", "-j", min=0, help="Worker processes for the simulations (0: one per CPU).")] = 0,
    generalisation: Annotated[bool, typer.Option(
        "--generalisation", help="Also refit with each chunk size and each D left out and predict it.")] = False,
    accept_worse: Annotated[bool, typer.Option(
        "--force", "--accept-worse", help="Write the fit even if it predicts the held-out configurations worse than "
        "the base on a quantity (labelled calibrated-worse-than-base, calibration_check.forced; the output says so).")
    ] = False,
    report: Annotated[Path | None, typer.Option(
        "--report", help="Write every figure (parameters, fit errors, held-out errors per configuration) as JSON.")
    ] = None,
) -> None:
    """Fit a profile to measured records and report the emulator's error on held-out configurations."""
    options = {**locals(), "also_predict": also_predict or []}
    from pdexporter.predict.calibrate_job import CalibrationRequest, calibrate_job

    request = CalibrationRequest(**options)
    with _CalibrationBar(console) as bar:
        run = calibrate_job(request, bar)
    show(run.outcome(), make_console())


class _CalibrationBar:
    """One rich progress bar across every stage of `sim calibrate` (`predict.calibrate_job.CalibrationProgress`):
    its total grows as stages plan their work (simulated (B, D) groups) and shrinks when a stage
    ends under budget, so the ETA covers the whole run. Off a terminal, one line per stage."""

    def __init__(self, console: Console) -> None:
        from rich import progress as rp

        self.console = console
        self.progress = rp.Progress(rp.TextColumn("[progress.description]{task.description}"), rp.BarColumn(),
                                    rp.TaskProgressColumn(), rp.TextColumn("{task.fields[info]}"),
                                    rp.TimeElapsedColumn(), rp.TextColumn("ETA"), rp.TimeRemainingColumn(),
                                    console=console, transient=True)
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


@sim_app.command("sweep")
def sim_sweep(
    sweep_file: SweepFileArg,
    profile: Annotated[str | None, typer.Option(
        "--profile", help="Embedded engine's GPU/model profile (default: the imitated engine's: SGLang's "
                          "h200-sglang0.5.15-qwen3-coder-30b-a3b for an SGLang sweep, else "
                          f"{DEFAULT_PROFILE}).")] = None,
    out: Annotated[Path | None, typer.Option(
        "--out", help="Results directory (default: results/sim/{profile}/{sweep name}).")] = None,
    mode: ModeOpt = None,
    reps: RepsOpt = None,
    chunk_index: ChunkIndexOpt = None,
) -> None:
    """Predict a sweep's whole table with the embedded engine on a virtual clock (records say modelled)."""
    from pdexporter._internal.writable import check_writable
    from pdexporter.measure.store import ResultsStore
    from pdexporter.sweep.job import prediction_out, prediction_spec

    spec = prediction_spec(sweep_file, profile=profile, mode=mode, reps=reps, chunk_index=chunk_index)
    where = out or prediction_out(spec, sweep_file, profile or DEFAULT_PROFILE)
    sweep_and_report(spec, ResultsStore(check_writable(where, "--out" if out else "output")))
