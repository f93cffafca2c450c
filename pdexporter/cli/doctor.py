"""`pdexporter doctor [--target URL]`: check what the numbers will rest on, one line per check."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from pdexporter.cli._common import (
    DEFAULT_PROFILE,
    ApiKeyFileOpt,
    ModelOpt,
    ProfileOpt,
    TargetOpt,
    api_key,
    console,
    make_launcher,
    run_async,
)
from pdexporter.cli._vocab import B_FLAGS
from pdexporter.doctor import Check, EndpointFacts, EngineFacts, evaluate, failed
from pdexporter.errors import ConfigError

STYLE = {"ok": "green", "warn": "yellow", "fail": "bold red", "skip": "dim"}
EMBEDDED_CHUNK_SIZE = 8192


def register(app: typer.Typer) -> None:
    app.command("doctor")(doctor)


def doctor(
    target: TargetOpt = None,
    chunk_size: Annotated[int | None, typer.Option(
        *B_FLAGS, min=1, help="The engine's max_num_batched_tokens (tokens per step), if you know it (vLLM "
        "does not publish it).")] = None,
    prometheus: Annotated[str | None, typer.Option(
        "--prometheus", help="Prometheus base URL to check (reachable, and whether it holds pdexporter series).")
    ] = None,
    otlp: Annotated[str | None, typer.Option(
        "--otlp", help="OTLP/HTTP endpoint to check (default: $OTEL_EXPORTER_OTLP_TRACES_ENDPOINT or "
        "$OTEL_EXPORTER_OTLP_ENDPOINT, as `run` uses).")] = None,
    model: ModelOpt = None,
    api_key_file: ApiKeyFileOpt = None,
    profile: ProfileOpt = DEFAULT_PROFILE,
) -> None:
    """Check the engine (reachable, version, model, max_model_len, chunk size, step log, prefix
    caching, CUDA graphs) and the Prometheus and OTLP endpoints; exit 1 if a check fails."""
    if target is not None and not target.startswith(("http://", "https://")):
        raise ConfigError(f"--target {target!r}: expected an http:// or https:// URL")
    if prometheus is not None and not prometheus.startswith(("http://", "https://")):
        raise ConfigError(f"--prometheus {prometheus!r}: expected an http:// or https:// URL")
    token = api_key(api_key_file)
    with console.status("starting the embedded engine ..." if target is None else f"asking {target} ..."):
        engine = run_async(_engine(target, chunk_size, model, token, profile))
    with console.status("checking the endpoints ..."):
        from pdexporter.doctor.gather import otlp_facts, prometheus_facts

        endpoints: list[EndpointFacts] = [prometheus_facts(prometheus), otlp_facts(otlp)]
    checks = evaluate(engine, endpoints)
    print_checks(checks, engine)
    if failed(checks):
        raise typer.Exit(1)


async def _engine(target: str | None, chunk_size: int | None, model: str | None, token: str | None,
                  profile: str) -> EngineFacts:
    from pdexporter.doctor.gather import engine_facts

    launcher = make_launcher(target, chunk_size=chunk_size, profile=profile)
    capture = None
    if target is None:
        from pdexporter.sim.profile import load_profile

        chunk_size = chunk_size or EMBEDDED_CHUNK_SIZE
        sizes = load_profile(profile).engine.capture_sizes(chunk_size)  # vLLM's rule, with this chunk size
        capture = max(sizes) if sizes else None
    try:
        handle = await launcher.start(chunk_size or EMBEDDED_CHUNK_SIZE)
        return await engine_facts(handle, embedded=target is None, model=model, api_key=token,
                                  chunk_size=chunk_size, cudagraph_max_tokens=capture)
    finally:
        await launcher.stop()


def print_checks(checks: list[Check], engine: EngineFacts) -> None:
    out = Console()
    where = "the embedded engine (modelled)" if engine.embedded else engine.url
    table = Table(title=f"pdexporter doctor: {where}", title_justify="left", show_lines=False)
    table.add_column("check", no_wrap=True)
    table.add_column("verdict", no_wrap=True)
    table.add_column("why")
    for check in checks:
        table.add_row(check.name, f"[{STYLE[check.status]}]{check.status}[/]", check.why)
    out.print(table, highlight=False)
    counts = {s: sum(1 for c in checks if c.status == s) for s in STYLE}
    verdict = "FAIL" if counts["fail"] else ("OK, with warnings" if counts["warn"] else "OK")
    out.print(f"{verdict}: {counts['ok']} ok, {counts['warn']} warn, {counts['fail']} fail, {counts['skip']} skipped",
              highlight=False)
