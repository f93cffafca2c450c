"""An engine someone else runs: pdexporter cannot change its chunk size. Its command line, where the
operator gives it (`--engine-command`, a sweep file's `launcher.command`), goes into every record, as a
launcher that starts the engine puts its own: what the fit reads the engine's CUDA-graph sizes from."""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from dataclasses import dataclass

from pdexporter._internal.redact import redact_argv
from pdexporter.errors import ConfigError
from pdexporter.launch.base import EngineHandle

__all__ = [
    "ExternalLauncher", "engine_command_words",
]


def engine_command_words(text: str | Sequence[str] | None, option: str = "--engine-command",
                         chunk_size: int | None = None, engine: str | None = None) -> tuple[str, ...] | None:
    """The words of an engine's command line as the operator gives it (None: not given), secrets redacted
    (`--api-key x` -> `***`). One line naming `option` where it cannot be split, is empty, or names a chunk
    size (its engine's chunk flag) other than `chunk_size`."""
    if text is None:
        return None
    try:
        words = shlex.split(text) if isinstance(text, str) else [str(w) for w in text]
    except ValueError as exc:
        raise ConfigError(f"{option}: cannot split it into words ({exc})") from None
    if not words:
        raise ConfigError(f"{option}: empty; give the command the engine was started with, e.g. 'vllm serve ...'")
    from pdexporter.engines import command_chunk_size

    said = command_chunk_size(words, engine, option)
    if said is not None and chunk_size is not None and said[1] != chunk_size:
        raise ConfigError(f"{option}: it starts the engine with {said[0]} {said[1]}, but the chunk size given is "
                          f"{chunk_size}; give the one it runs with")
    return tuple(redact_argv(words))

@dataclass
class ExternalLauncher:
    """An engine already running. `chunk_size` is what the operator says it was started with
    (None: not said; an engine that publishes it, SGLang, says it through `client.identity`)."""

    url: str
    chunk_size: int | None = None
    gpu: str | None = None
    engine: str | None = None  # the user's --engine (or launcher.engine); None: the engine says who it is
    # how the operator started it, secrets redacted (`engine_command_words`); None: not said
    command: tuple[str, ...] | None = None
    name: str = "external"

    @property
    def can_set_chunk_size(self) -> bool:
        return False

    def attaches(self, chunk_size: int) -> bool:
        """Always: the engine runs already (`launch.base.Attaching`), there is nothing to start."""
        return True

    async def start(self, chunk_size: int) -> EngineHandle:
        if self.chunk_size is not None and chunk_size != self.chunk_size:
            raise ConfigError(
                f"chunk size {chunk_size}: the external engine at {self.url} runs with "
                f"chunk size {self.chunk_size} and pdexporter cannot restart it; "
                "use a launcher that owns the engine (local, sim, kubernetes)"
            )
        return EngineHandle(url=self.url, chunk_size=self.chunk_size, kind=self.engine, gpu=self.gpu,
                            command=self.command)

    async def stop(self) -> None:
        return None


