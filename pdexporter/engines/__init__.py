"""Engine adapters: one module per engine, registered by name (see `_registry`)."""

from pdexporter.engines import sim, vllm  # noqa: F401  (registration)
from pdexporter.engines import disagg  # noqa: F401  (registration, after vllm and sim)
from pdexporter.engines._registry import (
    BUDGET_RULE,
    COLOCATED,
    ChunkRule,
    EngineAdapter,
    KvSetup,
    adapter,
    budget_schedule,
    chunk_size_advice,
    identify,
    infer_chunk_size,
    register,
    registered,
)

__all__ = ["BUDGET_RULE", "COLOCATED", "ChunkRule", "EngineAdapter", "KvSetup", "adapter", "budget_schedule", "chunk_size_advice", "identify", "infer_chunk_size", "register", "registered"]
