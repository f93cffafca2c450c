"""The `pdexporter` command: one thin module per subcommand, each calling the library."""

from __future__ import annotations

import sys

import typer

from pdexporter.errors import PdexporterError

app = typer.Typer(
    name="pdexporter",
    help="Prefill/decode interference: measure it on vLLM, export it, decide P/D offload with it.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


@app.callback()
def _root(
    version: bool = typer.Option(False, "--version", help="Print the version and exit.", is_eager=True),
) -> None:
    if version:
        from pdexporter import __version__

        print(__version__)
        raise typer.Exit()


def _register() -> None:
    from pdexporter.cli import compare, dashboards, decide, export_table, load, measure, reanalyse, report, run, sim, sweep

    for module in (run, measure, sweep, sim, export_table, compare, report, decide, reanalyse, dashboards, load):
        module.register(app)


_register()


def main(argv: list[str] | None = None) -> None:
    """Entry point: user errors become one line on stderr and a non-zero exit code."""
    try:
        app(args=argv, prog_name="pdexporter")
    except PdexporterError as exc:
        print(f"pdexporter: error: {exc}", file=sys.stderr)
        sys.exit(exc.exit_code)
    except KeyboardInterrupt:
        print("pdexporter: interrupted", file=sys.stderr)
        sys.exit(130)
