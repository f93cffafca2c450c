"""The engine-adapter protocol and the registry engines are found in by name.

An adapter holds every rule of one engine that pdexporter depends on, so that supporting a new
engine (or a new version's renames) touches one module: how it splits a prefill into chunks
beside running decodes (`ChunkRule`), its step budget, the names of its /metrics series, the
format of its per-step log, the flags that set the chunk size and turn that log on, where it
says who it is and how to recognise it. Modelled on GuideLLM's `Backend.register`: a class
registers itself under a name, and records name the engine that produced them
(`config.engine`), so analysis finds the same rules again.

The registry is the only way in: `adapter(name)` needs a name and refuses one nobody registered
(one line listing those that are), and nothing outside this package imports a concrete adapter
module (tests/unit/engines/test_seam.py): the rest of pdexporter imports `pdexporter.engines`.
docs/engines.md says how to add an engine.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal, Protocol, TypeVar, runtime_checkable

from pdexporter.errors import ConfigError

__all__ = [
    "BUDGET_RULE",
    "COLOCATED",
    "METRIC_KINDS",
    "Arm",
    "ChunkRule",
    "EngineAdapter",
    "IterationStep",
    "KvRole",
    "KvSetup",
    "MetricKind",
    "adapter",
    "budget_problem",
    "budget_schedule",
    "chunk_size_advice",
    "flag_values",
    "identify",
    "identity_paths",
    "infer_chunk_size",
    "info_labels",
    "largest_graph",
    "last_cause",
    "metric_name",
    "register",
    "registered",
]

MetricKind = Literal["gauge", "counter", "histogram"]

# The canonical /metrics vocabulary everything downstream reads: name -> kind. Each adapter maps
# (some of) these names to its engine's own series (`EngineAdapter.metric_aliases`).
METRIC_KINDS: dict[str, MetricKind] = {
    "num_requests_running": "gauge",
    "num_requests_waiting": "gauge",
    "kv_cache_usage_perc": "gauge",
    "prompt_tokens_total": "counter",
    "generation_tokens_total": "counter",
    "prefix_cache_queries_total": "counter",
    "prefix_cache_hits_total": "counter",
    "num_preemptions_total": "counter",
    "request_success_total": "counter",
    "inter_token_latency_seconds": "histogram",
    "time_to_first_token_seconds": "histogram",
    "iteration_tokens": "histogram",
    "request_prefill_time_seconds": "histogram",
    "request_decode_time_seconds": "histogram",
    "request_queue_time_seconds": "histogram",
    "e2e_request_latency_seconds": "histogram",
    "kv_transfer_time_seconds": "histogram",
    "kv_transfer_bytes": "histogram",
    "kv_transfer_failures_total": "counter",
    # the engine's process start (Prometheus' process collector): a new value is a restart
    "process_start_time_seconds": "gauge",
}


@dataclass(frozen=True, slots=True)
class IterationStep:
    """One engine step as its per-step log tells it (the adapter's `parse_step_log`): the new
    prompt ("context") requests and tokens it computed, the decodes ("generation") it advanced,
    and its time where the engine logs one (0.0 where it does not)."""

    iteration: int
    context_requests: int
    context_tokens: int
    generation_requests: int
    generation_tokens: int
    elapsed_ms: float

    @property
    def is_mixed(self) -> bool:
        return self.context_tokens > 0 and self.generation_requests > 0
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



def largest_graph(sizes: Sequence[int]) -> int:
    """The longest step (tokens) an engine replays as a CUDA graph, from the sizes it captured (ascending; none: 0,
    every step launched eagerly): `ChunkRule.graph_max_tokens` where the engine's flags say its `graph_sizes`."""
    return sizes[-1] if sizes else 0

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
      vLLM 0.22 captures up to 512 tokens unless told otherwise (`--max-cudagraph-capture-size`).
    - `graph_sizes`: the step sizes (tokens) the engine captured graphs for, where its command line says (vLLM
      pads a step to the next of them and replays that graph: a 1,310-token step beside 3 decodes runs the
      2,064-token graph where 1,040 and 2,064 are the sizes); () where unknown (no padding is modelled).
      The padding itself is `decision_eval.padded_graph_tokens` (priced past 512 tokens: `graph_step_tokens`),
      which routers read too.
    - `decodes_pay_chunk_tokens`: every running decode in a chunk's step costs that step time in
      proportion to the chunk's tokens (the cost model's delta x D x c): the decodes run as rows of
      the chunk's attention batch and each pays the chunk's length, not its own one token (SGLang
      0.5.15's mixed chunks with triton attention: ~0.018 ms per chunk token per decode on the H200).
      Only the fit reads it (the coefficient it fits is in decision.json); False leaves that term out.

    What follows from them, for the window maths (`decode_view`, `resume_lag_steps`): decodes that
    pause see the prefill's chunk steps, which such an engine runs back to back (SGLang continues
    a chunked request before anything else), as one stall, and take their next step only after
    the step that produced the prefill's first token."""

    decodes_take_budget: bool = True
    decodes_in_chunk_step: bool = True
    graph_max_tokens: int = 0
    decodes_pay_chunk_tokens: bool = False
    graph_sizes: tuple[int, ...] = ()

    def budget(self, chunk_size: int, running_decodes: int) -> int:
        """Prefill tokens per step beside `running_decodes` decodes."""
        return chunk_size - running_decodes if self.decodes_take_budget else chunk_size

    def graph_step(self, chunk: int, running_decodes: int) -> bool:
        """Does a step carrying a chunk of `chunk` tokens beside the decodes replay a CUDA graph?"""
        beside = running_decodes if self.decodes_in_chunk_step else 0
        return self.graph_max_tokens > 0 and chunk + beside <= self.graph_max_tokens

    def problem(self, chunk_size: int, running_decodes: int) -> str | None:
        """Why that many decodes leave a prefill no budget at that chunk size, or None."""
        if self.budget(chunk_size, running_decodes) <= 0:
            return "the decodes would take the whole step budget and the prefill would never run"
        return None

    def schedule(self, prompt_tokens: int, chunk_size: int, running_decodes: int) -> tuple[int, ...]:
        """A cold P-token prefill's chunks in order: steps of `budget` tokens and a tail,
        ceil(P / budget) in all (vLLM: ceil(P / (B - D)))."""
        budget = self.budget(chunk_size, running_decodes)
        if budget <= 0:
            raise ValueError(f"chunk size {chunk_size} leaves no budget beside {running_decodes} decodes")
        if prompt_tokens < 1:
            raise ValueError(f"prompt of {prompt_tokens} tokens")
        n = math.ceil(prompt_tokens / budget)
        return (budget,) * (n - 1) + (prompt_tokens - budget * (n - 1),)

    def decode_view(self, chunks: Sequence[int]) -> tuple[int, ...]:
        """The chunk steps as the running decodes see them: one step per chunk where they run in
        the chunk's step; one stall of all the chunks' tokens where they pause."""
        if self.decodes_in_chunk_step or len(chunks) <= 1:
            return tuple(chunks)
        return (sum(chunks),)

    @property
    def resume_lag_steps(self) -> int:
        """Decode steps between the prefill's first token and the running decodes' next token: 0
        where they share the last chunk's step, 1 where they paused for it (their next step runs
        after it, and its token is the one that ends their stall)."""
        return 0 if self.decodes_in_chunk_step else 1

    def to_dict(self) -> dict[str, bool | int | list[int]]:
        out: dict[str, bool | int | list[int]] = {"decodes_take_budget": self.decodes_take_budget,
                                                  "decodes_in_chunk_step": self.decodes_in_chunk_step,
                                                  "graph_max_tokens": self.graph_max_tokens}
        if self.decodes_pay_chunk_tokens:  # absent: False (documents written before it existed)
            out["decodes_pay_chunk_tokens"] = True
        if self.graph_sizes:  # absent: unknown, no padding (documents written before it existed)
            out["graph_sizes"] = list(self.graph_sizes)
        return out


BUDGET_RULE = ChunkRule(graph_max_tokens=512)  # vLLM's (0.22: CUDA graphs captured up to 512 tokens)


@runtime_checkable
class EngineAdapter(Protocol):
    """What pdexporter needs to know about one engine."""

    name: str
    # the engine's chunk size (vLLM's max_num_batched_tokens, SGLang's chunked_prefill_size) when
    # nobody says, and the sizes `infer_chunk_size` tries
    default_chunk_size: int
    candidate_chunk_sizes: tuple[int, ...]
    # the command-line flag that sets the chunk size (a launcher's template, a Kubernetes patch)
    chunk_flag: str
    # canonical metric name (`METRIC_KINDS`) -> (kind, the engine's own names, newest first)
    metric_aliases: Mapping[str, tuple[MetricKind, tuple[str, ...]]]
    # canonical names only some setups export (a KV connector's): their absence is no gap
    optional_metrics: frozenset[str]
    # its OTLP per-request span: name, and canonical attribute -> the engine's attribute name
    # ("" and {} for an engine whose traces pdexporter cannot read)
    request_span_name: str
    request_span_attributes: Mapping[str, str]
    # (module, names) its own OTLP tracing imports, tried in the engine's Python before its trace
    # export is turned on (`pdexporter doctor --engine-python`); () where pdexporter reads no traces
    tracing_imports: tuple[tuple[str, tuple[str, ...]], ...]
    # the /metrics info series whose labels carry the KV-cache settings (prefix caching), if any
    cache_config_metric: str | None
    # the arm, KV connector and pair role of this engine setup (COLOCATED for a plain engine)
    kv: KvSetup
    # how its steps interleave a prefill's chunks with the running decodes
    chunk_rule: ChunkRule
    # the GET path that says who the engine is (`recognise` reads its JSON answer)
    identity_path: str
    # the embedded engine's profile when it imitates this engine and nobody names one (None: the
    # house default, vLLM's H200 profile); a profile holds the engine's step times (its kernels)
    sim_profile: str | None
    # whether its /metrics request gauges (`num_requests_running`, `num_requests_waiting`) say what
    # runs now: set from every step's scheduler stats (vLLM), so a scrape while the probes decode is
    # exact and a window whose engine ran other than its D probes can be refused; False where they
    # are set only when a batch is logged (SGLang: every `decode_log_interval` decode steps), so
    # they may be stale and are only reported (`measure.protocol.injection_problem`)
    request_gauges_per_step: bool

    def chunk_schedule(self, prompt_tokens: int, chunk_size: int, running_decodes: int) -> tuple[int, ...]:
        """The prefill's chunk sizes, in order, when `running_decodes` decodes run beside it (what
        the engine's step log shows: one entry per step that computes prompt tokens)."""
        ...

    def budget_problem(self, chunk_size: int, running_decodes: int) -> str | None:
        """Why that many decodes leave a prefill no budget at that chunk size, or None."""
        ...

    def joint_prefill_tokens(self, prefills: Sequence[tuple[float, float, int]], step_ns: float) -> int | None:
        """Several prefills (each (scheduled, first token, prompt tokens), one clock, ns) that ended
        in one run of slow steps, as the running decodes saw them: the prompt tokens of the one
        chunked stream the engine ran them as (the chunk schedule of that P is then the run's), or
        None where its scheduler did not run them as one stream (or nobody checked that it does)."""
        ...

    def parse_step_log(self, lines: Iterable[str]) -> list[IterationStep]:
        """The engine's per-step log lines as `IterationStep`s (lines it does not know are skipped)."""
        ...

    def format_step(self, step: IterationStep) -> str:
        """One step as the engine logs it (`parse_step_log` reads it back unchanged); raw files keep
        a window's steps in this form."""
        ...

    def cuda_graphs(self, argv: Sequence[str]) -> bool | None:
        """Whether an engine started with these arguments captures CUDA graphs (None: unknown)."""
        ...

    def graph_sizes(self, argv: Sequence[str], chunk_size: int) -> tuple[int, ...] | None:
        """Every step size (tokens) an engine started with these arguments and this chunk size captures a CUDA graph
        for, ascending (() none; None: its flags do not say, and the rule's `graph_max_tokens` stands). A smaller
        step is padded to the next of them, and the largest is the longest step it replays as a graph: the fit's
        chunk rule takes both from the records' `engine_command` (`ChunkRule.graph_sizes`, `graph_max_tokens`;
        `analysis.models.fit_data`)."""
        ...

    def chunk_size_flags(self, chunk_size: int) -> tuple[str, ...]:
        """Command-line flags that start the engine with this chunk size, its step log (one line
        per step) and its /metrics on."""
        ...

    def for_command(self, argv: Sequence[str], role: str | None = None) -> str:
        """The registered name of this engine's setup when started with `argv` (in a P/D pair's
        `role`): e.g. vLLM with DecodeBenchConnector is "vllm-decode-bench", SGLang with
        --enable-mixed-chunk "sglang-mixed"."""
        ...

    def recognise(self, identity: Mapping[str, object]) -> bool:
        """Does this JSON answer of `identity_path` come from this engine (setup)?"""
        ...

    def served_chunk_size(self, identity: Mapping[str, object]) -> int | None:
        """The chunk size the engine says it runs with, in its `identity_path` answer (None: it
        does not publish it; vLLM 0.22 does not)."""
        ...

    def setup_problems(self, identity: Mapping[str, object]) -> tuple[str, ...]:
        """What in the engine's published settings keeps pdexporter from exact numbers (a step
        log that skips steps, /metrics off), each one line naming the flag that fixes it."""
        ...

    def prefix_caching(self, identity: Mapping[str, object], metrics_text: str | None) -> bool | None:
        """Whether the engine caches prompt prefixes (None: cannot tell)."""
        ...

    def start_failure(self, log_lines: Sequence[str]) -> str:
        """Why a start that exited failed, in one line of its log: the root cause, not a later line
        of another of its processes saying that one failed (`last_cause`)."""
        ...


_EXCEPTION_LINE = re.compile(r"\b(?:[A-Z]\w*(?:Error|Exception|Exit)|Exception|AssertionError)\b: \S")


def flag_values(argv: Sequence[str], flag: str) -> list[str]:
    """Every value `flag` is given on an engine's command line (`flag VALUE` or `flag=VALUE`), in order."""
    found = []
    for i, word in enumerate(argv):
        if word == flag and i + 1 < len(argv):
            found.append(argv[i + 1])
        elif word.startswith(flag + "="):
            found.append(word.split("=", 1)[1])
    return found


def command_chunk_size(argv: Sequence[str], engine: str | None = None,
                       option: str = "engine command") -> tuple[str, int] | None:
    """The chunk size an engine's command line starts it with: (flag, tokens) of `engine`'s chunk flag, or with
    no engine named of the first registered adapter whose flag it gives (vLLM's --max-num-batched-tokens,
    SGLang's --chunked-prefill-size); None where it gives none. A value that is not a positive whole number is
    one line naming `option` and the flag."""
    adapters = [adapter(engine)] if engine is not None else list(_ADAPTERS.values())
    for flag in dict.fromkeys(a.chunk_flag for a in adapters):
        values = flag_values(argv, flag)
        if not values:
            continue
        try:
            tokens = int(values[-1])
        except ValueError:
            tokens = 0
        if tokens < 1:
            raise ConfigError(f"{option}: {flag} {values[-1]!r} is not a chunk size (a whole number of tokens)")
        return flag, tokens
    return None


def last_cause(lines: Sequence[str], wrappers: Sequence[str] = ()) -> str:
    """What a failed engine start's log says went wrong, in one line: its last exception line that is
    not one of `wrappers` (an engine's own "see the root cause above"), else its last line."""
    lines = [line.strip() for line in lines if line.strip()]
    causes = [line for line in lines if _EXCEPTION_LINE.search(line) and not any(w in line for w in wrappers)]
    return (causes or lines or ["(empty log)"])[-1]


_A = TypeVar("_A")
_ADAPTERS: dict[str, EngineAdapter] = {}


def register(*names: str) -> Callable[[type[_A]], type[_A]]:
    """Class decorator: `@register("vllm")` makes `adapter("vllm")` return an instance."""

    def wrap(cls: type[_A]) -> type[_A]:
        instance = cls()
        if not isinstance(instance, EngineAdapter):
            raise TypeError(f"{cls.__name__} does not implement EngineAdapter")
        for name in names:
            if name in _ADAPTERS:
                raise TypeError(f"engine {name!r} is registered twice ({cls.__name__})")
            _ADAPTERS[name] = instance
        return cls

    return wrap


def adapter(name: str) -> EngineAdapter:
    """The adapter registered under `name`; one line naming the registered engines for any other
    (a record, sweep file or flag with an engine nobody registered)."""
    found = _ADAPTERS.get(name) if isinstance(name, str) else None
    if found is None:
        raise ConfigError(f"engine {name!r}: not a registered engine (registered: {', '.join(registered())})")
    return found


def metric_name(engine: str, canonical: str) -> str:
    """The engine's newest name for a canonical series (its adapter's `metric_aliases`), as a
    prometheus_client metric object is created to expose it (a counter without its `_total`): the
    name an imitation of the engine serves, declared once, where pdexporter reads it."""
    kind, names = adapter(engine).metric_aliases[canonical]
    return names[0].removesuffix("_total") if kind == "counter" else names[0]


def registered() -> tuple[str, ...]:
    return tuple(sorted(_ADAPTERS))


def identity_paths() -> tuple[str, ...]:
    """The GET paths the registered engines say who they are at, in registration order."""
    return tuple(dict.fromkeys(a.identity_path for a in _ADAPTERS.values()))


def identify(identity: Mapping[str, object], path: str = "/version") -> EngineAdapter | None:
    """The engine that answered `path` this way: the most specific adapter that recognises it
    (the last registered: an engine that speaks another's API registers after it)."""
    seen: list[EngineAdapter] = []
    for candidate in _ADAPTERS.values():
        if candidate not in seen and candidate.identity_path == path:
            seen.append(candidate)
    for candidate in reversed(seen):
        if candidate.recognise(identity):
            return candidate
    return None


def info_labels(metrics_text: str | None, metric: str | None) -> dict[str, str] | None:
    """The labels of an info series (e.g. vLLM's `vllm:cache_config_info`) in a /metrics text, if there."""
    if not metrics_text or not metric:
        return None
    from prometheus_client.parser import text_string_to_metric_families

    try:
        for family in text_string_to_metric_families(metrics_text):
            for sample in family.samples:
                if sample.name == metric:
                    return dict(sample.labels)
    except (ValueError, TypeError, IndexError):
        return None
    return None


def budget_schedule(prompt_tokens: int, chunk_size: int, running_decodes: int) -> tuple[int, ...]:
    """A step budget of `chunk_size` tokens, running decodes served first (one token each), the
    prefill given the rest: chunks of B - D tokens and a tail, ceil(P / (B - D)) in all."""
    return BUDGET_RULE.schedule(prompt_tokens, chunk_size, running_decodes)


def budget_problem(chunk_size: int, running_decodes: int) -> str | None:
    return BUDGET_RULE.problem(chunk_size, running_decodes)


def chunk_size_advice(windows: Sequence[tuple[int, int, int]], chunk_size: int, source: str,
                      engine: str, candidates: Iterable[int] | None = None) -> str:
    """One line for a user whose windows contradict the chunk size's schedule: the sizes that fit
    (the schedule as the decodes see it: `ChunkRule.decode_view`)."""
    rule = adapter(engine)

    def seen(p: int, b: int, d: int) -> tuple[int, ...]:
        return rule.chunk_rule.decode_view(rule.chunk_schedule(p, b, d))

    best, fits = infer_chunk_size(windows, candidates or rule.candidate_chunk_sizes, seen, rule.default_chunk_size)
    # a window contradicted the size in use, so it is not among the answers, whatever the looser
    # count of slow steps allows (the audit's line named 2048 as not fitting, then as fitting)
    others = tuple(b for b in fits if b != chunk_size)
    likely = best if best in others else (others[0] if len(others) == 1 else None)
    return (f"the probes' slow steps do not fit chunk size {chunk_size} ({source}); other sizes that fit: "
            f"{', '.join(map(str, others)) or 'none'}{f' (likely {likely})' if likely else ''}: pass --chunk-size")


def infer_chunk_size(
    windows: Sequence[tuple[int, int, int]],
    candidates: Iterable[int],
    schedule: Callable[[int, int, int], tuple[int, ...]],
    default: int,
    max_stall_steps: int = 4,
) -> tuple[int | None, tuple[int, ...]]:
    """Which chunk sizes fit the slow steps seen? `windows` are (P, D, median slow steps); a size
    fits when every window saw at least its full chunks and at most `max_stall_steps` more.
    Returns (the default if it fits, else the only fit, else None; every size that fits)."""
    fits = []
    for b in candidates:
        ok = True
        for p, d, slow in windows:
            try:
                sizes = schedule(p, b, d)
            except ValueError:  # no budget beside D decodes at this size
                ok = False
                break
            full = sum(1 for s in sizes if s >= 0.25 * max(sizes))
            if not full <= slow <= len(sizes) + max_stall_steps:
                ok = False
                break
        if ok:
            fits.append(b)
    if default in fits:
        return default, tuple(fits)
    return (fits[0] if len(fits) == 1 else None), tuple(fits)
