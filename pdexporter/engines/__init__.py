"""Engine adapters: one module per engine, registered by name (see `_registry`).

This package's names below are the only way the rest of pdexporter reaches an engine's rules:
nothing outside `pdexporter/engines/` imports one of its modules (tests/unit/engines/test_seam.py).
"""

# Registration, in this order: vLLM first (its /version is asked first), then the engines whose
# adapters build on it, the embedded engine's and the P/D setups last.
from pdexporter.engines import vllm  # noqa: F401, I001
from pdexporter.engines import sglang  # noqa: F401
from pdexporter.engines import sim  # noqa: F401
from pdexporter.engines import disagg  # noqa: F401
from pdexporter.engines._registry import (
    BUDGET_RULE,
    COLOCATED,
    METRIC_KINDS,
    ChunkRule,
    EngineAdapter,
    IterationStep,
    KvSetup,
    MetricKind,
    adapter,
    budget_schedule,
    chunk_size_advice,
    command_chunk_size,
    identify,
    identity_paths,
    infer_chunk_size,
    info_labels,
    largest_graph,
    metric_name,
    register,
    registered,
)
from pdexporter.engines.disagg import (
    DECODE_BENCH,
    NIXL,
    P2P_NCCL,
    SIM_KINDS,
    PairEntry,
    PairSide,
    check_pair,
    connector_of,
    pair_connector,
)
from pdexporter.engines.sim import IMITATED, SIM_ENGINE, imitation_for, sim_engine
from pdexporter.engines.disagg import VllmPdDecodeAdapter
from pdexporter.engines.vllm import (
    DEFAULT_MOE_CONFIG_LOG,
    OpenAICompatibleAdapter,
    VllmAdapter,
    cudagraph_sizes,
    tuned_moe_config,
)

# The name an engine nobody identified is recorded under (vLLM's rules, as a stated assumption).
UNIDENTIFIED = OpenAICompatibleAdapter.name
# The engine meant where nothing names one: a record written before `config.engine` existed, a
# fit or decision of no records, the embedded engine's imitation and a sweep's launcher by default
# (vLLM's rules). Everything outside this package says DEFAULT_ENGINE, never the name.
DEFAULT_ENGINE = VllmAdapter.name
# The chunk size (B) meant where nothing gives one: the default engine's own default (vLLM's
# max_num_batched_tokens on a >= 70 GB GPU), the embedded engine's and the exporter's.
DEFAULT_CHUNK_SIZE = VllmAdapter.default_chunk_size
# The decode instance of a P/D pair a sweep launches (launch/pair.py starts vLLM instances).
PAIR_ENGINE = VllmPdDecodeAdapter.name

__all__ = [
    "BUDGET_RULE",
    "COLOCATED",
    "DECODE_BENCH",
    "DEFAULT_CHUNK_SIZE",
    "DEFAULT_ENGINE",
    "DEFAULT_MOE_CONFIG_LOG",
    "IMITATED",
    "METRIC_KINDS",
    "NIXL",
    "P2P_NCCL",
    "PAIR_ENGINE",
    "SIM_ENGINE",
    "SIM_KINDS",
    "UNIDENTIFIED",
    "ChunkRule",
    "EngineAdapter",
    "IterationStep",
    "KvSetup",
    "MetricKind",
    "PairEntry",
    "PairSide",
    "adapter",
    "budget_schedule",
    "check_pair",
    "chunk_size_advice",
    "command_chunk_size",
    "connector_of",
    "cudagraph_sizes",
    "identify",
    "identity_paths",
    "infer_chunk_size",
    "imitation_for",
    "info_labels",
    "largest_graph",
    "metric_name",
    "pair_connector",
    "register",
    "registered",
    "sim_engine",
    "tuned_moe_config",
]
