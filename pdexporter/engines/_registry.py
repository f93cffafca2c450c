"""The engine-adapter protocol and the registry engines are found in by name.

An adapter holds every rule of one engine that pdexporter depends on, so that supporting a new
engine (or a new version's renames) touches one module: how it splits a prefill into chunks
beside running decodes, its step budget, the names of its /metrics series, the format of its
per-step log, the flags that set the chunk size and turn that log on, and how to recognise it.
Modelled on GuideLLM's `Backend.register`: a class registers itself under a name, and records
name the engine that produced them (`config.engine`), so analysis finds the same rules again.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal, Protocol, TypeVar, runtime_checkable

from pdexporter.engine.iterlog import IterationStep

__all__ = [
    "Arm", "BUDGET_RULE", "COLOCATED", "ChunkRule", "EngineAdapter", "KvRole", "KvSetup", "MetricKind", "adapter", "budget_problem",
    "budget_schedule", "chunk_size_advice", "identify", "infer_chunk_size", "register", "registered",
]

MetricKind = Literal["gauge", "counter", "histogram"]
Arm = Literal["colocated", "offloaded"]
KvRole = Literal["decode-bench", "decode", "prefill"]


@dataclass(frozen=True)
class KvSetup:
    """Which side of the offload decision an engine setup measures (docs/disaggregation.md).

    `arm`: "colocated" (the prefill runs beside the decodes, the seed's setup) or "offloaded"
    (the engine is the decode instance of a P/D pair: a new request arrives with its KV computed
    elsewhere). `connector`: vLLM's KV connector (`--kv-transfer-config`'s kv_connector), None
    without one. `role`: what the engine does in the pair ("decode-bench": DecodeBenchConnector
    fills every new request's KV, a free transfer on one GPU; "decode"/"prefill": the two
    instances of a real pair)."""

    arm: Arm = "colocated"
    connector: str | None = None
    role: KvRole | None = None


COLOCATED = KvSetup()


@dataclass(frozen=True)
class ChunkRule:
    """How an engine interleaves a prefill's chunks with the running decodes, in the two numbers the
    cost maths needs (written into decision.json, so the standard-library evaluator needs no
    engine knowledge):

    - `decodes_take_budget`: each running decode takes one token of the step budget B first, so a
      chunk is B - D tokens (vLLM; SGLang with --enable-mixed-chunk); False: a chunk is B tokens.
    - `decodes_in_chunk_step`: the running decodes advance in the step that carries a chunk (vLLM,
      SGLang mixed); False: they pause while the chunk's step runs (SGLang's default), so every
      chunk step costs each decode the whole step.
    - `graph_max_tokens`: the largest step (tokens, the decodes beside the chunk included when they
      share its step) the engine runs as a CUDA graph by default; a longer step is launched kernel
      by kernel, which on a MoE model costs tens of ms whatever the chunk (0: no graphs, or unknown).
      vLLM 0.22 captures up to 512 tokens unless told otherwise (`--max-cudagraph-capture-size`)."""

    decodes_take_budget: bool = True
    decodes_in_chunk_step: bool = True
    graph_max_tokens: int = 0

    def budget(self, chunk_size: int, running_decodes: int) -> int:
        """Prefill tokens per step beside `running_decodes` decodes."""
        return chunk_size - running_decodes if self.decodes_take_budget else chunk_size

    def graph_step(self, chunk: int, running_decodes: int) -> bool:
        """Does a step carrying a chunk of `chunk` tokens beside the decodes replay a CUDA graph?"""
        beside = running_decodes if self.decodes_in_chunk_step else 0
        return self.graph_max_tokens > 0 and chunk + beside <= self.graph_max_tokens

    def to_dict(self) -> dict[str, bool | int]:
        return {"decodes_take_budget": self.decodes_take_budget, "decodes_in_chunk_step": self.decodes_in_chunk_step,
                "graph_max_tokens": self.graph_max_tokens}


BUDGET_RULE = ChunkRule(graph_max_tokens=512)  # vLLM's (0.22: CUDA graphs captured up to 512 tokens)


@runtime_checkable
class EngineAdapter(Protocol):
    """What pdexporter needs to know about one engine."""

    name: str
    # the engine's max_num_batched_tokens when nobody says, and the sizes `infer_chunk_size` tries
    default_chunk_size: int
    candidate_chunk_sizes: tuple[int, ...]
    # canonical metric name -> (kind, the engine's own names, newest first)
    metric_aliases: Mapping[str, tuple[MetricKind, tuple[str, ...]]]
    # its OTLP per-request span: name, and canonical attribute -> the engine's attribute name
    request_span_name: str
    request_span_attributes: Mapping[str, str]
    # the /metrics info series whose labels carry the KV-cache settings (prefix caching), if any
    cache_config_metric: str | None
    # the arm, KV connector and pair role of this engine setup (COLOCATED for a plain engine)
    kv: KvSetup
    # how its steps interleave a prefill's chunks with the running decodes
    chunk_rule: ChunkRule

    def chunk_schedule(self, prompt_tokens: int, chunk_size: int, running_decodes: int) -> tuple[int, ...]:
        """The prefill's chunk sizes, in order, when `running_decodes` decodes run beside it."""
        ...

    def budget_problem(self, chunk_size: int, running_decodes: int) -> str | None:
        """Why that many decodes leave a prefill no budget at that chunk size, or None."""
        ...

    def parse_step_log(self, lines: Iterable[str]) -> list[IterationStep]:
        """The engine's per-step log lines as `IterationStep`s (lines it does not know are skipped)."""
        ...

    def format_step(self, step: IterationStep) -> str:
        """One step as the engine logs it."""
        ...

    def cuda_graphs(self, argv: Sequence[str]) -> bool | None:
        """Whether an engine started with these arguments captures CUDA graphs (None: unknown)."""
        ...

    def chunk_size_flags(self, chunk_size: int) -> tuple[str, ...]:
        """Command-line flags that start the engine with this chunk size and its step log on."""
        ...

    def recognise(self, version_payload: Mapping[str, object]) -> bool:
        """Does a `/version` answer come from this engine?"""
        ...


_A = TypeVar("_A")
_ADAPTERS: dict[str, EngineAdapter] = {}


def register(*names: str) -> Callable[[type[_A]], type[_A]]:
    """Class decorator: `@register("vllm")` makes `adapter("vllm")` return an instance."""

    def wrap(cls: type[_A]) -> type[_A]:
        instance = cls()
        if not isinstance(instance, EngineAdapter):
            raise TypeError(f"{cls.__name__} does not implement EngineAdapter")
        for name in names:
            _ADAPTERS[name] = instance
        return cls

    return wrap


def adapter(name: str | None) -> EngineAdapter:
    """The adapter registered under `name`; an unknown or missing name gets vLLM's (every engine
    pdexporter measures speaks vLLM's API, and the embedded engine follows vLLM's rules)."""
    return _ADAPTERS.get(name or "", _ADAPTERS["vllm"])


def registered() -> tuple[str, ...]:
    return tuple(sorted(_ADAPTERS))


def identify(version_payload: Mapping[str, object]) -> EngineAdapter | None:
    """The engine that answered `/version` this way: the most specific adapter that recognises it
    (the last registered: an engine that speaks vLLM's API registers after vLLM)."""
    seen: list[EngineAdapter] = []
    for candidate in _ADAPTERS.values():
        if candidate not in seen:
            seen.append(candidate)
    for candidate in reversed(seen):
        if candidate.recognise(version_payload):
            return candidate
    return None


def budget_schedule(prompt_tokens: int, chunk_size: int, running_decodes: int) -> tuple[int, ...]:
    """A step budget of `chunk_size` tokens, running decodes served first (one token each), the
    prefill given the rest: chunks of B - D tokens and a tail, ceil(P / (B - D)) in all."""
    budget = chunk_size - running_decodes
    if budget <= 0:
        raise ValueError(f"chunk size {chunk_size} leaves no budget beside {running_decodes} decodes")
    if prompt_tokens < 1:
        raise ValueError(f"prompt of {prompt_tokens} tokens")
    n = math.ceil(prompt_tokens / budget)
    return (budget,) * (n - 1) + (prompt_tokens - budget * (n - 1),)


def budget_problem(chunk_size: int, running_decodes: int) -> str | None:
    if running_decodes >= chunk_size:
        return "the decodes would take the whole step budget and the prefill would never run"
    return None


def chunk_size_advice(windows: Sequence[tuple[int, int, int]], chunk_size: int, source: str,
                      engine: str | None, candidates: Iterable[int] | None = None) -> str:
    """One line for a user whose windows contradict the chunk size's schedule: the sizes that fit."""
    rule = adapter(engine)
    best, fits = infer_chunk_size(windows, candidates or rule.candidate_chunk_sizes, rule.chunk_schedule,
                                  rule.default_chunk_size)
    return (f"the probes' slow steps do not fit chunk size {chunk_size} ({source}); sizes that fit: "
            f"{', '.join(map(str, fits)) or 'none'}{f' (likely {best})' if best else ''}: pass --chunk-size")


def infer_chunk_size(
    windows: Sequence[tuple[int, int, int]], candidates: Iterable[int], schedule: Callable[[int, int, int], tuple[int, ...]],
    default: int, max_stall_steps: int = 4,
) -> tuple[int | None, tuple[int, ...]]:
    """Which chunk sizes fit the slow steps seen? `windows` are (P, D, median slow steps); a size
    fits when every window saw at least its full chunks and at most `max_stall_steps` more.
    Returns (the default if it fits, else the only fit, else None; every size that fits)."""
    fits = []
    for b in candidates:
        ok = True
        for p, d, slow in windows:
            if b <= d:
                ok = False
                break
            sizes = schedule(p, b, d)
            full = sum(1 for s in sizes if s >= 0.25 * max(sizes))
            if not full <= slow <= len(sizes) + max_stall_steps:
                ok = False
                break
        if ok:
            fits.append(b)
    if default in fits:
        return default, tuple(fits)
    return (fits[0] if len(fits) == 1 else None), tuple(fits)
