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
