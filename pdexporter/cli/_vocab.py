"""The command line's one vocabulary, and the command classes that keep every command to it.

The grid's three numbers have one long name and one short flag in every command, the names of
the record fields, table columns and sweep-file keys they fill (docs/spec.md):

    -D  --decode-batch-size   decode streams running beside the prefill (requests)
    -P  --new-prefill-tokens  tokens the prefill computes (a cold prompt: nothing cached)
    -B  --chunk-size          the engine's max_num_batched_tokens (tokens per step)

Older names still work for one release (`DEPRECATED`): they are rewritten to the new one before
parsing, hidden from --help, and each use prints one `pdexporter: warning:` line. Durations take
the one syntax of `pdexporter._internal.durations` (`DURATION`).

`Command` and `Group` are typer's classes with pdexporter's help: flags show no `<bool>`, and
positionals show as `SWEEP_FILE` in the usage line and the Arguments panel (typer's own
rendering is `{sweep_file}`).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any

from typer.core import TyperArgument, TyperCommand, TyperGroup, TyperOption
from typer.models import DefaultPlaceholder

D_FLAGS = ("--decode-batch-size", "-D")
P_FLAGS = ("--new-prefill-tokens", "-P")
B_FLAGS = ("--chunk-size", "-B")

# old long name -> the name it became (kept for one release; README "Command line")
DEPRECATED: dict[str, str] = {
    "--probe-decode": "--decode-batch-size",  # run
    "--prefill-tokens": "--new-prefill-tokens",  # run
    "--for-decodes": "--decode-batch-size",  # thresholds
}

DURATION = "<duration>"  # the metavar of every duration option
DURATION_SYNTAX = "500ms, 30s, 1h30m or seconds"


def deprecated_line(old: str, new: str) -> str:
    return f"pdexporter: warning: {old} is now {new}; the old name goes in the next release"


def rewrite_deprecated(args: Sequence[str], known: set[str], warn: Any = None) -> list[str]:
    """`args` with each deprecated long name (`--probe-decode 4`, `--probe-decode=4`) replaced by the
    name it became, where the command has that name (`known`) and not the old one; one warning
    line per name used. Stops at `--` (what follows is not an option)."""
    out: list[str] = []
    warned: set[str] = set()
    rest = False
    for arg in args:
        if rest or arg == "--":
            rest = True
            out.append(arg)
            continue
        name, eq, value = arg.partition("=")
        new = DEPRECATED.get(name)
        if new is None or new not in known or name in known:
            out.append(arg)
            continue
        if name not in warned:
            warned.add(name)
            (warn or _stderr)(deprecated_line(name, new))
        out.append(f"{new}{eq}{value}")
    return out


def _stderr(line: str) -> None:
    print(line, file=sys.stderr)


def _tidy(param: Any) -> None:
    """pdexporter's help for one parameter: no type shown for a flag, an argument in CAPITALS."""
    if isinstance(param, TyperOption) and (param.is_flag or param.count) and param.metavar is None:
        param.metavar = ""  # typer shows <bool> for every flag otherwise
    elif isinstance(param, TyperArgument) and param.metavar is None and param.name:
        param.metavar = param.name.upper()


def _usage(param: Any) -> str:
    name = param.metavar or (param.name or "").upper()
    name = name if param.required else f"[{name}]"
    return name + ("..." if param.nargs != 1 else "")


class _Tidy:
    """Flags without `<bool>` or `{arg}`: every parameter and the help option tidied."""

    params: list[Any]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        for param in self.params:
            _tidy(param)

    def get_help_option(self, ctx: Any) -> Any:
        option = super().get_help_option(ctx)  # type: ignore[misc]
        if option is not None:
            _tidy(option)
        return option


class Command(_Tidy, TyperCommand):
    """A pdexporter command: pdexporter's help rendering and the deprecated names."""

    def collect_usage_pieces(self, ctx: Any) -> list[str]:
        pieces = [self.options_metavar] if self.options_metavar else []
        for param in self.get_params(ctx):
            pieces.extend([_usage(param)] if isinstance(param, TyperArgument) else param.get_usage_pieces(ctx))
        return pieces

    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:
        known = {opt for param in self.params for opt in (*param.opts, *param.secondary_opts)}
        return super().parse_args(ctx, rewrite_deprecated(args, known))


class Group(_Tidy, TyperGroup):
    """A pdexporter command group (`pdexporter`, `pdexporter sim`): flags without `<bool>`."""


def use_commands(app: Any) -> None:
    """Make every command registered on `app` (and its sub-apps) a `Command`, its groups `Group`s."""
    for info in app.registered_commands:
        if _unset(info.cls, TyperCommand):
            info.cls = Command
    for group in app.registered_groups:
        if _unset(group.cls, TyperGroup):
            group.cls = Group
        if group.typer_instance is not None:
            use_commands(group.typer_instance)


def _unset(cls: Any, default: type) -> bool:
    """No class chosen: None, typer's placeholder for its default, or the default itself."""
    return cls is None or cls is default or isinstance(cls, DefaultPlaceholder)
