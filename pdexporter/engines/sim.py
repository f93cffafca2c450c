"""pdexporter's embedded engine: it follows vLLM's rules (its scheduler implements vLLM's chunking
as code, and a test holds the two equal), serves vLLM's API and metric names, and logs vLLM's
per-step lines; it differs in how it says who it is (`/version` carries `"modelled": true`)."""

from __future__ import annotations

from collections.abc import Mapping

from pdexporter.engines._registry import register
from pdexporter.engines.vllm import VllmAdapter

__all__ = [
    "SIM_ENGINE", "SimAdapter",
]

SIM_ENGINE = "pdexporter-sim"


@register(SIM_ENGINE)
class SimAdapter(VllmAdapter):
    name = SIM_ENGINE

    def chunk_size_flags(self, chunk_size: int) -> tuple[str, ...]:
        return ("--max-num-batched-tokens", str(chunk_size))

    def recognise(self, version_payload: Mapping[str, object]) -> bool:
        return version_payload.get("modelled") is True
