"""`pdexporter dashboards generate|push`: the Grafana dashboards built by pdexporter.grafana."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated

import typer

from pdexporter.cli._common import console, duration_option, seconds
from pdexporter.errors import ConfigError

DEFAULT_OUT = Path("dashboards")
DEFAULT_CHART = Path("helm/pdexporter")

dashboards_app = typer.Typer(help="Grafana dashboards: regenerate the JSON, or push it to a Grafana.",
                             no_args_is_help=True)


def register(app: typer.Typer) -> None:
    app.add_typer(dashboards_app, name="dashboards")


def in_checkout(directory: Path) -> bool:
    """Is `directory` the root of a pdexporter source tree (where dashboards/ is committed)?"""
    try:
        text = (directory / "pyproject.toml").read_text(encoding="utf-8")
    except OSError:
        return False
    return re.search(r'^name\s*=\s*"pdexporter"', text, re.M) is not None


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
    from pdexporter._internal.writable import check_writable
    from pdexporter.grafana import generate as write_all
    from pdexporter.grafana import stale_files

    if out is None:
        if not in_checkout(Path.cwd()):
            raise ConfigError(f"--out not given and {Path.cwd()} is not a pdexporter checkout (no pyproject.toml "
                              "naming pdexporter): pass --out DIR")
        out = DEFAULT_OUT
    targets = [out]
    if chart is not None and chart.is_dir():
        targets.append(chart / "dashboards")
    elif chart is not None and chart != DEFAULT_CHART:
        raise ConfigError(f"--chart {chart}: not a directory")
    if check:
        stale = [path for directory in targets for path in stale_files(directory)]
        for path in stale:
            console.print(f"[red]stale:[/] {path}")
        if stale:
            console.print("run `pdexporter dashboards generate` and commit the result")
            raise typer.Exit(1)
        console.print(f"dashboards up to date in {', '.join(map(str, targets))}")
        return
    for flag, target in zip(("--out", "--chart"), targets):
        check_writable(target, flag)
    for written in write_all(targets):
        print(written)


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
