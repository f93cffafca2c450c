"""`pdexporter dashboards generate|push`: the Grafana dashboards built by pdexporter.grafana."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from pdexporter.cli._common import console, duration_option, seconds, show
from pdexporter.grafana.job import DEFAULT_CHART

dashboards_app = typer.Typer(help="Grafana dashboards: regenerate the JSON, or push it to a Grafana.",
                             no_args_is_help=True)


def register(app: typer.Typer) -> None:
    app.add_typer(dashboards_app, name="dashboards")


@dashboards_app.command("generate")
def generate(
    out: Annotated[
        Path | None,
        typer.Option(
            "--out", help="Directory for the dashboard JSON files (default: dashboards/ of a pdexporter checkout)."
        ),
    ] = None,
    chart: Annotated[
        Path | None,
        typer.Option("--chart", help="Helm chart whose dashboards/ copies are rewritten too (skipped if absent)."),
    ] = DEFAULT_CHART,
    check: Annotated[
        bool, typer.Option("--check", help="Write nothing; exit 1 if any committed file differs from the code.")
    ] = False,
) -> None:
    """Rewrite dashboards/*.json (and the Helm chart's copies) from the builders in pdexporter.grafana."""
    from pdexporter.grafana.job import generate_dashboards

    done = generate_dashboards(out, chart, check=check)
    show(done.notes)
    for written in done.written:
        print(written)
    if done.stale:
        raise typer.Exit(1)


@dashboards_app.command("push")
def push(
    grafana_url: Annotated[str, typer.Option("--grafana-url", help="Grafana base URL, e.g. http://grafana:3000.")],
    token_file: Annotated[
        Path | None, typer.Option("--token-file", help="File holding a Grafana service-account token.")
    ] = None,
    folder: Annotated[str, typer.Option("--folder", help="Folder to put the dashboards in (created if missing; "
                                                         "'General' for the root).")] = "pdexporter",
    timeout: Annotated[str, duration_option("--timeout", "Longest wait for each API call")] = "10s",
) -> None:
    """Create or overwrite the dashboards in a Grafana, matched by their stable uids."""
    from pdexporter.grafana import build_all
    from pdexporter.grafana.push import push_dashboards, read_token, redact

    timeout_s = seconds(timeout, "--timeout", positive=True)
    token = read_token(token_file)
    base = redact(grafana_url).rstrip("/")
    for pushed in push_dashboards(grafana_url, build_all(), token=token, folder=folder, timeout=timeout_s):
        console.print(f"pushed {pushed.uid} (version {pushed.version}) {base}{pushed.url}", soft_wrap=True)
