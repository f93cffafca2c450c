"""Which launcher a command's --target/--engine/--profile mean: an external engine at a URL, or
the embedded one imitating an engine (vllm by default)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from pdexporter.errors import ConfigError
from pdexporter.launch.base import Launcher

__all__ = [
    "DEFAULT_IMITATED", "claimed_engine", "command_of", "imitated_option", "make_launcher",
]


DEFAULT_IMITATED = "vllm"  # what the embedded engine imitates without --engine


def claimed_engine(target: str | None, engine: str | None) -> str | None:
    """The engine (adapter name) a command measures, as far as it is known before anything
    starts: --engine with --target (None: the engine will say), the embedded engine imitating
    --engine without. A name nobody registered is one line."""
    from pdexporter.engines import adapter, sim_engine

    if target:
        return None if engine is None else adapter(engine).name
    return sim_engine(engine or DEFAULT_IMITATED)


def command_of(target: str | None, engine_command: str | None, chunk_size: int | None,
               engine: str | None) -> tuple[tuple[str, ...] | None, tuple[str, int] | None]:
    """--engine-command's words (`launch.external.engine_command_words`), checked before anything starts (only
    with --target, naming no other chunk size than --chunk-size), and the (flag, chunk size) it starts the engine
    with (None: not given, or it does not say): what stands for --chunk-size where that is not given."""
    from pdexporter.engines import command_chunk_size
    from pdexporter.launch.external import engine_command_words

    if engine_command is not None and not target:
        raise ConfigError("--engine-command: only with --target (the embedded engine is started by pdexporter)")
    words = engine_command_words(engine_command, chunk_size=chunk_size, engine=engine)
    return words, None if words is None else command_chunk_size(words, engine)


def imitated_option(target: str | None, claimed: str | None) -> str | None:
    """The --engine that gives `claimed` back (`claimed_engine`'s inverse): the adapter with a
    target, the imitated engine of the embedded one."""
    if target or claimed is None:
        return claimed
    from pdexporter.engines import IMITATED

    return next((name for name, kind in IMITATED.items() if kind == claimed), DEFAULT_IMITATED)


def make_launcher(target: str | None, *, chunk_size: int | None, profile: str, gpu: str | None = None,
                  log_dir: Path | None = None, engine: str | None = None,
                  engine_command: Sequence[str] | None = None) -> Launcher:
    """`--target URL` means an external engine at that chunk size (`engine`: what it is, if it
    cannot say; `engine_command`: how it was started, `launch.external.engine_command_words`); none
    means the embedded one imitating `engine` (vllm by default), whose --profile is read here, before
    anything starts (a wrong name is one line, not a child's exit)."""
    from pdexporter.launch.external import ExternalLauncher
    from pdexporter.launch.sim import SimLauncher

    claimed = claimed_engine(target, engine)
    if target:
        return ExternalLauncher(url=target, chunk_size=chunk_size, gpu=gpu, engine=claimed,
                                command=None if engine_command is None else tuple(engine_command))
    from pdexporter.sim.profile import load_profile

    load_profile(profile)
    return SimLauncher(profile=profile, log_dir=log_dir, engine=engine or DEFAULT_IMITATED)
