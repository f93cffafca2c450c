"""The `pdexporter` command: one thin module per subcommand, each calling the library."""

from __future__ import annotations

import importlib
import sys
from typing import Any

import typer

# typer >= 0.26 carries its own copy of click (and no longer installs click): its commands raise
# these classes, not click's (pyproject pins typer >= 0.26).
from typer._click.exceptions import BadParameter, ClickException, NoArgsIsHelpError, UsageError

from pdexporter.cli._vocab import Group, use_commands
from pdexporter.errors import Interrupted, PdexporterError

# Each command, and the module under pdexporter.cli that registers it (in --help's order). `main`
# imports only the module of the command it runs: a command starts in about half the time of
# importing all fourteen (numpy, pandas, scipy, matplotlib, OpenTelemetry, ...; ~1 s of CPU each).
COMMANDS: dict[str, str] = {
    "run": "run",
    "measure": "measure",
    "sweep": "sweep",
    "sim": "sim",
    "export-table": "export_table",
    "compare": "compare",
    "report": "report",
    "decide": "decide",
    "reanalyse": "reanalyse",
    "dashboards": "dashboards",
    "doctor": "doctor",
    "load": "load",
    # both arms of the offload decision (docs/disaggregation.md)
    "thresholds": "thresholds",
    "validate-pd": "validate_pd",
    # every model's error on campaigns it was not fitted on (docs/analysis.md, "Held-out campaigns")
    "validate": "validate",
}


def _print_version(value: bool) -> None:
    """`--version`: an eager option callback, so it answers before a command is looked for."""
    if value:
        from pdexporter import __version__

        print(f"pdexporter {__version__}")
        raise typer.Exit()


def _root(
    version: bool = typer.Option(False, "--version", help="Print the version and exit.", is_eager=True,
                                 callback=_print_version),
) -> None:
    pass


_apps: dict[str | None, typer.Typer] = {}


def command_app(command: str | None = None) -> typer.Typer:
    """The `pdexporter` app with one command registered (`command`, a key of COMMANDS), or with
    all of them (None: what `--help` lists). Built once per process and kept."""
    if command not in _apps:
        built = typer.Typer(
            name="pdexporter",
            help="Prefill/decode interference: measure it on vLLM, export it, decide P/D offload with it.",
            no_args_is_help=True,
            add_completion=False,
            pretty_exceptions_enable=False,
            cls=Group,
        )
        built.callback()(_root)
        for name in COMMANDS if command is None else (command,):
            importlib.import_module(f"pdexporter.cli.{COMMANDS[name]}").register(built)
        use_commands(built)
        _apps[command] = built
    return _apps[command]


def __getattr__(name: str) -> Any:
    """`pdexporter.cli.app`: every command registered (imported on first use, not by `main`)."""
    if name == "app":
        return command_app()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _command_of(args: list[str]) -> str | None:
    """The command the arguments name, when they name one: the first word that is not an option
    (the root takes only flags: --version, --help)."""
    word = next((a for a in args if not a.startswith("-")), None)
    return word if word in COMMANDS else None


def _not_finite(value: object) -> bool:
    import math

    try:
        return not math.isfinite(float(value))  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return False


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
        value = error.get("input")
        why = "not a finite number" if _not_finite(value) else describe_error(error)  # nan failed "<= 1e7"
        message = f"{flag} {value}: {why}"
    message = _hide_stray_tokens(" ".join(message.split()))
    if exc.ctx is not None:
        message += f" (see {exc.ctx.command_path} --help)"
    return message


def _hide_stray_tokens(message: str) -> str:
    """click quotes a stray positional word back ("Got unexpected extra argument (W)"): a word that
    looks like a key (16+ letters and digits, a token's alphabet) was likely meant for an option's
    value or a file, and is not echoed (the secrets audit: `run -D 4 sk-...` printed the key)."""
    import re

    def hide(match: re.Match[str]) -> str:
        words = [w if not _token_like(w) else f"<{len(w)} characters not shown: it looks like a key>"
                 for w in match.group(2).split(" ")]
        return f"{match.group(1)}({' '.join(words)})"

    start = message.find("unexpected extra argument")  # one place to match from (a search from every
    if start < 0:                                       # repetition of it was quadratic)
        return message
    return message[:start] + re.sub(r"^(unexpected extra arguments? ?(?:\(s\))? )\((.*)\)", hide, message[start:],
                                    count=1)


def _token_like(word: str) -> bool:
    """16+ characters of a key's alphabet (letters, digits, '-', '_'), both letters and digits."""
    import re

    return (len(word) >= 16 and re.fullmatch(r"[A-Za-z0-9_\-]+", word) is not None
            and re.search(r"[0-9]", word) is not None and re.search(r"[A-Za-z]", word) is not None)


def main(argv: list[str] | None = None) -> None:
    """Entry point: user errors become one line on stderr and a non-zero exit code. Everything the
    command prints goes through `_internal.redact` (the secrets it holds, URL passwords, quoted
    Authorization headers: `***`)."""
    from pdexporter._internal.redact import RedactingStream, remember_argv

    args = sys.argv[1:] if argv is None else argv
    remember_argv(args)
    saved = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = RedactingStream(sys.stdout), RedactingStream(sys.stderr)
    try:
        _main(args)
    except (SystemExit, KeyboardInterrupt):
        raise
    except BaseException:  # a bug: its traceback through the same filter (it may quote a secret)
        import traceback

        traceback.print_exc()
        sys.exit(1)
    finally:
        sys.stdout, sys.stderr = saved


def _main(args: list[str]) -> None:
    try:
        code = command_app(_command_of(args))(args=args, prog_name="pdexporter", standalone_mode=False)
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
