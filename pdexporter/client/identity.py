"""Who an engine is, asked over HTTP: each registered engine's identity path (`engines.identity_paths`:
vLLM's /version, SGLang's /server_info), the first JSON answer an adapter recognises, and how
that squares with what pdexporter was told (a launcher's or the user's engine name).

The I/O is `ask_identity`; `settle_engine` is the pure rule: the engine's own word wins where it
says more (SGLang's /server_info says whether mixed chunking is on; pdexporter's embedded engine
says it is modelled), the launcher's where it knows more (vLLM's /version does not name its KV
connector, the command line does), and a contradiction (told SGLang, answering as vLLM) is one
line, not a record under the wrong name.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from pdexporter.client.client import EngineClient
from pdexporter.engines import UNIDENTIFIED, EngineAdapter, adapter, identify, identity_paths
from pdexporter.errors import ConfigError, EngineError

__all__ = ["Identity", "ask_identity", "settle_engine"]


@dataclass(frozen=True)
class Identity:
    """The engine's answer at `path` (`found`: the adapter that recognised it, None if none did)."""

    found: EngineAdapter | None
    path: str | None = None
    payload: Mapping[str, Any] = field(default_factory=dict)
    errors: tuple[str, ...] = ()  # what each path answered instead, when none was recognised

    @property
    def version(self) -> str | None:
        value = self.payload.get("version")
        return None if value is None else str(value)


async def ask_identity(client: EngineClient) -> Identity:
    """GET every registered identity path until an adapter recognises the answer. An answer no
    adapter recognises is kept (its version is still worth recording); one path that fails is
    no failure while another answers."""
    kept: Identity | None = None
    errors: list[str] = []
    for path in identity_paths():
        try:
            payload = json.loads(await client.get_text(path, retry=False))
        except EngineError as exc:
            errors.append(f"{path}: {exc}")
            continue
        except ValueError:
            errors.append(f"{path}: not JSON")
            continue
        if not isinstance(payload, dict):
            errors.append(f"{path}: not a JSON object")
            continue
        found = identify(payload, path)
        if found is not None:
            return Identity(found, path, payload)
        kept = kept or Identity(None, path, payload)
    return (
        Identity(None, kept.path, kept.payload, tuple(errors))
        if kept
        else Identity(None, errors=tuple(errors))
    )


def settle_engine(claimed: str | None, found: EngineAdapter | None, where: str) -> str:
    """The engine (setup) a measurement is recorded under: `claimed` (the launcher's or the user's
    name, None if nobody said) against `found` (what the engine says it is)."""
    if claimed in (None, UNIDENTIFIED):
        return found.name if found is not None else UNIDENTIFIED
    told = adapter(claimed)
    if found is None or found is told:
        return told.name
    if isinstance(found, type(told)):
        return found.name  # the engine says more: SGLang's mixed mode, the embedded engine
    if isinstance(told, type(found)):
        return told.name  # the launcher knows more: vLLM's KV connector from its command line
    raise ConfigError(
        f"{where}: said to be engine {told.name!r} (--engine or launcher.engine), but its "
        f"{found.identity_path} answers as {found.name!r}"
    )
