"""pdexporter's embedded engine, one adapter per engine it imitates. Imitating vLLM it follows
vLLM's rules (its scheduler implements vLLM's chunking as code, and a test holds the two equal),
serves vLLM's API and metric names and logs vLLM's per-step lines; imitating SGLang
(`sim serve --engine sglang [--enable-mixed-chunk]`) it schedules, logs, names its metrics and
says who it is (/server_info) as SGLang does. Either way it differs from the engine in how it
says who it is: its identity answer carries `"modelled": true`."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from pdexporter.engines._registry import register
from pdexporter.engines.sglang import SglangAdapter, SglangMixedAdapter
from pdexporter.engines.vllm import CHUNK_FLAG, VllmAdapter

__all__ = [
    "IMITATED",
    "SIM_ENGINE",
    "SIM_SGLANG",
    "SIM_SGLANG_MIXED",
    "SimAdapter",
    "SimSglangAdapter",
    "SimSglangMixedAdapter",
    "imitation_for",
    "sim_engine",
]

SIM_ENGINE = "pdexporter-sim"
SIM_SGLANG = "pdexporter-sim-sglang"
SIM_SGLANG_MIXED = "pdexporter-sim-sglang-mixed"
# The engine (setup) the embedded engine imitates -> the name its records carry.
IMITATED: dict[str, str] = {"vllm": SIM_ENGINE, "sglang": SIM_SGLANG, "sglang-mixed": SIM_SGLANG_MIXED}


def sim_engine(imitates: str) -> str:
    """The embedded engine's adapter name when it imitates `imitates` ("vllm", "sglang", "sglang-mixed")."""
    from pdexporter.errors import ConfigError

    if imitates not in IMITATED:
        raise ConfigError(f"--engine {imitates!r}: the embedded engine imitates {', '.join(IMITATED)}")
    return IMITATED[imitates]


def imitation_for(engine: str) -> str:
    """The engine (setup) the embedded engine imitates to model records of `engine`: itself where it
    imitates it, the engine an embedded engine's records name it imitated, else the default (vLLM)."""
    if engine in IMITATED:
        return engine
    return next((name for name, kind in IMITATED.items() if kind == engine), VllmAdapter.name)


@register(SIM_ENGINE)
class SimAdapter(VllmAdapter):
    name = SIM_ENGINE

    def chunk_size_flags(self, chunk_size: int) -> tuple[str, ...]:
        return (CHUNK_FLAG, str(chunk_size))  # it logs every step and serves /metrics anyway

    def for_command(self, argv: Sequence[str], role: str | None = None) -> str:
        return self.name

    def graph_sizes(self, argv: Sequence[str], chunk_size: int) -> tuple[int, ...] | None:
        return None  # its profile's capture sizes decide, not `sim serve`'s flags: the rule's 512 stands

    def recognise(self, identity: Mapping[str, object]) -> bool:
        return identity.get("modelled") is True


class _SimSglang(SglangAdapter):
    def for_command(self, argv: Sequence[str], role: str | None = None) -> str:
        return SIM_SGLANG_MIXED if "--enable-mixed-chunk" in argv else SIM_SGLANG

    def recognise(self, identity: Mapping[str, object]) -> bool:
        return (
            identity.get("modelled") is True
            and "chunked_prefill_size" in identity
            and bool(identity.get("enable_mixed_chunk")) == self.mixed
        )


@register(SIM_SGLANG)
class SimSglangAdapter(_SimSglang):
    name = SIM_SGLANG


@register(SIM_SGLANG_MIXED)
class SimSglangMixedAdapter(_SimSglang, SglangMixedAdapter):
    name = SIM_SGLANG_MIXED
