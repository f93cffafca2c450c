"""The `pdexporter` command: one thin module per subcommand, each calling the library."""

from __future__ import annotations

import sys

import typer

from pdexporter.cli._vocab import Group, use_commands
from pdexporter.errors import Interrupted, PdexporterError

try:  # typer >= 0.25 carries its own copy of click
    from typer._click.exceptions import BadParameter, ClickException, NoArgsIsHelpError, UsageError
except ImportError:  # pragma: no cover - older typer on click
    from click.exceptions import (  # type: ignore[assignment]  # click's classes, typer's names
        BadParameter,
        ClickException,
        NoArgsIsHelpError,
        UsageError,
    )

app = typer.Typer(
    name="pdexporter",
    help="Prefill/decode interference: measure it on vLLM, export it, decide P/D offload with it.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    cls=Group,
)


def _print_version(value: bool) -> None:
    """`--version`: an eager option callback, so it answers before a command is looked for."""
    if value:
        from pdexporter import __version__

        print(f"pdexporter {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(False, "--version", help="Print the version and exit.", is_eager=True,
                                 callback=_print_version),
) -> None:
    pass


def _register() -> None:
    from pdexporter.cli import (
        compare,
        dashboards,
        decide,
        doctor,
        export_table,
        load,
        measure,
        reanalyse,
        report,
        run,
        sim,
        sweep,
        thresholds,
        validate_pd,
    )

    for module in (
        run,
        measure,
        sweep,
        sim,
        export_table,
        compare,
        report,
        decide,
        reanalyse,
        dashboards,
        doctor,
        load,
    ):
        module.register(app)
    for module in (thresholds, validate_pd):  # both arms of the offload decision (docs/disaggregation.md)
        module.register(app)
    use_commands(app)


_register()


def usage_error_line(exc: UsageError) -> str:
    """A command-line mistake as one line: `--reps 0: must be >= 1`, `No such option: --foo`,
    with the command's --help named (typer's own rendering is a five-line box)."""
    from pydantic import ValidationError

    from pdexporter._internal.validation import describe_error

    message = exc.format_message()
    cause = exc.__cause__
    if isinstance(exc, BadParameter) and isinstance(cause, ValidationError) and exc.param is not None \
            and exc.param.opts:
        error = cause.errors(include_url=False)[0]
        flag = max(exc.param.opts, key=len)  # the long name
        message = f"{flag} {error.get('input')}: {describe_error(error)}"
    message = " ".join(message.split())
    if exc.ctx is not None:
        message += f" (see {exc.ctx.command_path} --help)"
    return message


def main(argv: list[str] | None = None) -> None:
    """Entry point: user errors become one line on stderr and a non-zero exit code."""
    try:
        code = app(args=argv, prog_name="pdexporter", standalone_mode=False)
    except NoArgsIsHelpError as exc:  # bare `pdexporter` (or `pdexporter sim`): the help, and success
        text = exc.ctx.get_help() if exc.ctx is not None else exc.format_message()
        if text:  # typer prints its rich help itself and returns ""
            print(text)
        sys.exit(0)
    except UsageError as exc:
        print(f"pdexporter: error: {usage_error_line(exc)}", file=sys.stderr)
        sys.exit(exc.exit_code)
    except ClickException as exc:
        print(f"pdexporter: error: {' '.join(exc.format_message().split())}", file=sys.stderr)
        sys.exit(exc.exit_code)
    except Interrupted as exc:
        print(f"pdexporter: {exc}", file=sys.stderr)
        sys.exit(exc.exit_code)
    except PdexporterError as exc:
        print(f"pdexporter: error: {exc}", file=sys.stderr)
        sys.exit(exc.exit_code)
    except (KeyboardInterrupt, typer.Abort):
        print("pdexporter: interrupted", file=sys.stderr)
        sys.exit(130)
    if isinstance(code, int) and code != 0:
        if code == 130:  # typer turns a Ctrl-C inside a command into exit code 130
            print("pdexporter: interrupted", file=sys.stderr)
        sys.exit(code)
