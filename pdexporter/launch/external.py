"""An engine someone else runs: pdexporter cannot change its chunk size."""

from __future__ import annotations

from dataclasses import dataclass

from pdexporter.errors import ConfigError
from pdexporter.launch.base import EngineHandle

__all__ = [
    "ExternalLauncher",
]

@dataclass
class ExternalLauncher:
    """An engine already running. `chunk_size` is what the operator says it was started with
    (None: not said; an engine that publishes it, SGLang, says it through `client.identity`)."""

    url: str
    chunk_size: int | None = None
    gpu: str | None = None
    engine: str | None = None  # the user's --engine (or launcher.engine); None: the engine says who it is
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
        return EngineHandle(url=self.url, chunk_size=self.chunk_size, kind=self.engine, gpu=self.gpu)

    async def stop(self) -> None:
        return None


