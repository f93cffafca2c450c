"""vLLM v1's scheduler (0.22), reproduced as pure code: requests and KV blocks in, a step's batch out.

No clock and no I/O: the engine (`pdexporter.sim.engine`) calls `schedule()` when vLLM's engine
core would, and `update_from_output()` when a step's outputs come back. What follows mirrors
`vllm/v1/core/sched/scheduler.py` (`Scheduler.schedule`, `_update_after_schedule`,
`update_from_output`, `_preempt_request`), `vllm/v1/core/sched/async_scheduler.py` and
`vllm/v1/core/kv_cache_manager.py` (`get_computed_blocks`, `allocate_slots`); names follow them.

Token budget. Each step may schedule at most `max_num_batched_tokens` (B) tokens. There is no
"prefill phase" or "decode phase": every request has `num_computed_tokens` and
`num_tokens` (+ output placeholders under async scheduling) and each step tries to close the gap.

1. RUNNING requests first, in order (`while req_index < len(self.running) and token_budget > 0`):
   num_new = num_tokens + num_output_placeholders - num_computed_tokens, capped by
   `long_prefill_token_threshold` (when > 0), by what is left of the budget and by
   max_model_len - 1 - num_computed_tokens. A decode therefore takes one token; a request still
   prefilling takes min(remaining, budget left). A request whose placeholders already reach
   max_tokens is skipped (async: "avoid scheduling an extra step").
2. KV blocks for those tokens (`allocate_slots`). When the pool is short, the *last* running
   request is preempted (FCFS policy: `self.running.pop()`): its blocks are freed, it goes back
   to the front of the waiting queue with num_computed_tokens = 0 (recompute), and
   `vllm:num_preemptions_total` counts it. If the request itself was the victim, the loop stops.
3. WAITING requests, FCFS, only if nothing was preempted in this step and while the budget
   lasts and fewer than `max_num_seqs` run: prefix-cache hit first (`get_computed_blocks`), then
   num_new = num_tokens - hit, capped like above. A waiting request that cannot get its blocks
   stops the loop (head-of-line, like vLLM).

So with D decodes running, a cold prefill of P tokens gets B - D tokens per step:
num_chunks = ceil(P / (B - D)) (docs/vllm-facts.md: "8188 context tokens" at B = 8192, D = 4).

Prefix caching (16-token blocks, chained block hashes). A full block's hash is registered when
the block is allocated for tokens being scheduled (`cache_blocks` inside `allocate_slots`), so a
request in the same step can already hit it. A lookup may match at most num_tokens - 1 tokens
(`max_cache_hit_length = request.num_tokens - 1`: the last token must be computed for its
logits) rounded down to whole blocks: a new probe on a cached 4096-token prefix computes its
last 16 tokens. A prompt whose first block differs gets no hit (the hash chain breaks at once).
Freed blocks keep their hash and stay reusable until evicted (LRU, hashed blocks at the tail).

Async scheduling (0.22's default). `_update_after_schedule` advances num_computed_tokens at
schedule time and, for a request that will sample, adds an output placeholder, so the next
`schedule()` (which runs before this step's outputs exist) already gives it its next decode
token. `update_from_output` replaces a placeholder with the sampled token.

Context vs generation in the iteration log follows `compute_iteration_details`: a request is
"context" while it has no output token yet (vLLM: "A request is regarded as a context request if
its output tokens are still 0").

KV connectors (`SchedulerConnector`, `pdexporter.sim.kvconnector`; vLLM's `KVConnectorBase_V1`
scheduler side). A waiting request with nothing computed asks the connector, after the local
prefix-cache lookup, how many more tokens it can load (`get_num_new_matched_tokens`) and whether
the load is asynchronous. Synchronous (DecodeBenchConnector): the tokens count as computed at
once and the rest (one token) is scheduled in the same step; the step carries the fill
(`ScheduledRequest.num_external_tokens`). Asynchronous (NixlConnector, decode side): blocks for
the whole prompt are allocated, the request waits in WAITING_FOR_REMOTE_KVS, takes no budget and
keeps its place in the queue, and `SchedulerOutput.started_loads` tells the engine to start the
transfer; once the engine reports it done (`finish_remote_load`), the next schedule promotes the
request (`_update_waiting_for_remote_kv`: a full prompt hit recomputes its last token) and runs it
with one token. A finished request's `kv_transfer_params` come from `connector.request_finished`
(NixlConnector, prefill side: where the decode instance reads its blocks).
"""

from __future__ import annotations

import enum
from collections import OrderedDict, deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

__all__ = [
    "KVCacheManager", "NULL_HASH", "PrefixCacheStats", "Request", "RequestOutput", "RequestStatus",
    "ScheduledRequest", "Scheduler", "SchedulerConfig", "SchedulerConnector", "SchedulerOutput", "TokenSampler",
    "block_hashes", "default_sampler", "extend_hashes",
]


class RequestStatus(enum.IntEnum):
    WAITING_FOR_REMOTE_KVS = -1  # below WAITING: `finished` is `>= FINISHED_STOPPED`
    WAITING = 0
    RUNNING = 1
    PREEMPTED = 2
    FINISHED_STOPPED = 3
    FINISHED_LENGTH_CAPPED = 4
    FINISHED_ABORTED = 5

    @property
    def finished(self) -> bool:
        return self >= RequestStatus.FINISHED_STOPPED

    @property
    def finish_reason(self) -> str | None:
        return _FINISH_REASONS.get(self)


_FINISH_REASONS = {
    RequestStatus.FINISHED_STOPPED: "stop",
    RequestStatus.FINISHED_LENGTH_CAPPED: "length",
    RequestStatus.FINISHED_ABORTED: "abort",
}

NULL_HASH = 0x5EED


def block_hashes(token_ids: Sequence[int], block_size: int, parent: int = NULL_HASH, start: int = 0) -> list[int]:
    """Chained hashes of the full blocks of `token_ids` from block index `start` on.

    Python's hash of a tuple of ints is deterministic (no per-process salt), which is all a
    simulated prefix cache needs; vLLM uses sha256 of the same chain.
    """
    out = []
    for i in range(start * block_size, len(token_ids) - block_size + 1, block_size):
        parent = hash((parent, tuple(token_ids[i : i + block_size])))
        out.append(parent)
    return out


def extend_hashes(request: Request, n_blocks: int, block_size: int) -> list[int]:
    """The request's chained block hashes, computed up to `n_blocks` full blocks on demand.

    Lazily, so a 32K-token cold prompt is not hashed all at once when it arrives (a lookup stops
    at its first block; allocation hashes each chunk's blocks as they are scheduled).
    """
    hashes = request.block_hashes
    n_blocks = min(n_blocks, request.num_tokens // block_size)
    have = len(hashes)
    if have >= n_blocks:
        return hashes
    parent = hashes[-1] if hashes else NULL_HASH
    prompt = request.prompt_token_ids
    n_prompt = len(prompt)
    for i in range(have, n_blocks):
        lo, hi = i * block_size, (i + 1) * block_size
        tokens = tuple(prompt[lo:hi]) if hi <= n_prompt else tuple(request.token_at(j) for j in range(lo, hi))
        parent = hash((parent, tokens))
        hashes.append(parent)
    return hashes


@dataclass(eq=False, slots=True)
class Request:
    request_id: str
    prompt_token_ids: Sequence[int]
    max_tokens: int
    arrival_index: int = 0
    output_token_ids: list[int] = field(default_factory=list)
    status: RequestStatus = RequestStatus.WAITING
    num_computed_tokens: int = 0
    num_output_placeholders: int = 0
    num_preemptions: int = 0
    num_cached_tokens: int = -1
    is_prefill_chunk: bool = True
    block_hashes: list[int] = field(default_factory=list)
    num_prompt_tokens: int = -1
    num_tokens: int = -1  # prompt + outputs, kept in step with output_token_ids (hot path)
    seed: int = 0  # what the sampler's 'greedy' tokens depend on: the prompt's first tokens
    kv_transfer_params: dict | None = None  # the request's `kv_transfer_params` (P/D disaggregation)

    def __post_init__(self) -> None:
        self.num_prompt_tokens = len(self.prompt_token_ids)
        self.num_tokens = self.num_prompt_tokens + len(self.output_token_ids)
        self.seed = hash((self.num_prompt_tokens, tuple(self.prompt_token_ids[:16]))) & 0x7FFF_FFFF

    def append_output(self, token: int) -> None:
        self.output_token_ids.append(token)
        self.num_tokens += 1

    @property
    def num_output_tokens(self) -> int:
        return len(self.output_token_ids)

    def token_at(self, i: int) -> int:
        n = len(self.prompt_token_ids)
        return self.prompt_token_ids[i] if i < n else self.output_token_ids[i - n]


@dataclass(frozen=True, slots=True)
class ScheduledRequest:
    request: Request
    num_new_tokens: int
    num_computed_before: int  # context already in the KV cache: the attention's "s"
    is_context: bool  # vLLM's iteration-log class: no output token yet
    samples: bool  # this step produces a token for it (its prompt is done after this chunk)
    num_external_tokens: int = 0  # KV a synchronous connector writes for it in this step (DecodeBench fill)


@dataclass(frozen=True, slots=True)
class SchedulerOutput:
    step_id: int
    scheduled: tuple[ScheduledRequest, ...]
    total_num_scheduled_tokens: int
    preempted_request_ids: tuple[str, ...] = ()
    num_context_requests: int = 0  # vLLM's iteration-detail classes (compute_iteration_details)
    num_context_tokens: int = 0
    num_sampled: int = 0  # requests that produce a token in this step
    kv_fill_tokens: int = 0  # sum of num_external_tokens
    started_loads: tuple[Request, ...] = ()  # asynchronous KV loads to start (WAITING_FOR_REMOTE_KVS)

    @property
    def empty(self) -> bool:
        return self.total_num_scheduled_tokens == 0

    @property
    def num_generation_requests(self) -> int:
        return len(self.scheduled) - self.num_context_requests

    @property
    def num_generation_tokens(self) -> int:
        return self.total_num_scheduled_tokens - self.num_context_tokens

    def chunks(self) -> list[tuple[int, int]]:
        """(query length, context before) per request: the step-time model's input."""
        return [(s.num_new_tokens, s.num_computed_before) for s in self.scheduled]


@dataclass(frozen=True, slots=True)
class RequestOutput:
    """What one step produced for one request."""

    request_id: str
    new_token_ids: tuple[int, ...]
    num_output_tokens: int
    finish_reason: str | None = None
    kv_transfer_params: dict | None = None  # the connector's answer for a finished request

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass
class PrefixCacheStats:
    queries: int = 0
    hits: int = 0
    requests: int = 0


class KVCacheManager:
    """Paged KV blocks with prefix caching: vLLM's KVCacheManager + BlockPool for one group.

    Block 0 is the null block, never handed out (as in vLLM). Free blocks sit in an LRU queue;
    a freed block keeps its hash (and stays a cache hit) until it is handed out again.
    """

    def __init__(self, num_blocks: int, block_size: int, enable_caching: bool = True) -> None:
        if num_blocks < 2:
            raise ValueError(f"num_blocks={num_blocks}: need at least 2 (one is the null block)")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.enable_caching = enable_caching
        self._ref = [0] * num_blocks
        self._hash: list[int | None] = [None] * num_blocks
        self._free: OrderedDict[int, None] = OrderedDict.fromkeys(range(1, num_blocks))
        self._cached: dict[int, int] = {}
        self._req_blocks: dict[str, list[int]] = {}
        self._num_cached_blocks: dict[str, int] = {}
        self.stats = PrefixCacheStats()

    @property
    def num_free_blocks(self) -> int:
        return len(self._free)

    @property
    def usage(self) -> float:
        """vllm:kv_cache_usage_perc: 1 - free / usable (cached-but-free blocks count as free)."""
        return 1.0 - len(self._free) / (self.num_blocks - 1)

    def blocks_of(self, request_id: str) -> list[int]:
        return list(self._req_blocks.get(request_id, ()))

    def get_computed_blocks(self, request: Request) -> tuple[list[int], int]:
        """Longest cached prefix, whole blocks only, at most num_tokens - 1 tokens."""
        if not self.enable_caching:
            return [], 0
        bs = self.block_size
        max_blocks = (request.num_tokens - 1) // bs
        hits: list[int] = []
        cached = self._cached
        hashes = request.block_hashes
        for i in range(max_blocks):
            if i >= len(hashes):
                extend_hashes(request, min(max_blocks, 2 * i + 8), bs)
            block = cached.get(hashes[i])
            if block is None:
                break
            hits.append(block)
        self.stats.requests += 1
        self.stats.queries += request.num_tokens
        self.stats.hits += len(hits) * self.block_size
        return hits, len(hits) * self.block_size

    def allocate_slots(
        self,
        request: Request,
        num_new_tokens: int,
        new_computed_blocks: Sequence[int] = (),
        num_new_computed_tokens: int = 0,
    ) -> bool:
        """Blocks for `num_new_tokens` more tokens; False (nothing changed) if the pool is short."""
        rid = request.request_id
        blocks = self._req_blocks.get(rid)
        computed = request.num_computed_tokens + num_new_computed_tokens
        bs = self.block_size
        if blocks is not None and not new_computed_blocks and computed + num_new_tokens <= len(blocks) * bs:
            # hot path (a decode inside its last block): nothing to allocate, maybe a block to cache
            if self.enable_caching:
                end = min(computed + num_new_tokens, request.num_tokens) // bs
                if end > self._num_cached_blocks.get(rid, 0):
                    self._cache_full_blocks(request, blocks, self._num_cached_blocks.get(rid, 0), end * bs)
            return True
        have = (len(blocks) if blocks else 0) + len(new_computed_blocks)
        needed = -(-(computed + num_new_tokens) // bs) - have
        if needed < 0:
            needed = 0
        evictable = sum(1 for b in new_computed_blocks if self._ref[b] == 0)
        if needed + evictable > len(self._free):
            return False
        if blocks is None:
            blocks = self._req_blocks[rid] = []
        ref, free = self._ref, self._free
        for b in new_computed_blocks:
            if ref[b] == 0:
                del free[b]
            ref[b] += 1
            blocks.append(b)
        for _ in range(needed):
            b, _ = free.popitem(last=False)
            h = self._hash[b]
            if h is not None:
                if self._cached.get(h) == b:
                    del self._cached[h]
                self._hash[b] = None
            ref[b] = 1
            blocks.append(b)
        if self.enable_caching:
            start = max(self._num_cached_blocks.get(rid, 0), len(new_computed_blocks))
            self._cache_full_blocks(request, blocks, start, min(computed + num_new_tokens, request.num_tokens))
        return True

    def cache_blocks(self, request: Request, num_computed_tokens: int) -> None:
        """Register blocks that became full as outputs arrived (async scheduler's cache_blocks)."""
        if not self.enable_caching:
            return
        blocks = self._req_blocks.get(request.request_id)
        if blocks is None:
            return
        start = self._num_cached_blocks.get(request.request_id, 0)
        if min(num_computed_tokens, request.num_tokens) // self.block_size > start:
            self._cache_full_blocks(request, blocks, start, min(num_computed_tokens, request.num_tokens))

    def _cache_full_blocks(self, request: Request, blocks: list[int], start: int, num_tokens: int) -> None:
        end = min(num_tokens // self.block_size, len(blocks))
        if end <= start:
            return
        hashes = extend_hashes(request, end, self.block_size)
        for i in range(start, end):
            b = blocks[i]
            if self._hash[b] is None:
                h = hashes[i]
                self._hash[b] = h
                self._cached.setdefault(h, b)
        self._num_cached_blocks[request.request_id] = end

    def free(self, request: Request) -> None:
        """Release a request's blocks, last block first, so a prefix's head outlives its tail."""
        blocks = self._req_blocks.pop(request.request_id, None)
        self._num_cached_blocks.pop(request.request_id, None)
        if not blocks:
            return
        ref, free = self._ref, self._free
        for b in reversed(blocks):
            ref[b] -= 1
            if ref[b] == 0:
                free[b] = None
                if self._hash[b] is None:
                    free.move_to_end(b, last=False)  # nothing to keep: reuse it first


class SchedulerConnector(Protocol):
    """The scheduler side of a KV connector (vLLM's `KVConnectorBase_V1`, the methods it uses)."""

    def get_num_new_matched_tokens(self, request: Request, num_computed_tokens: int) -> tuple[int, bool]:
        """Tokens beyond the locally cached ones it can provide, and whether the load is asynchronous."""
        ...

    def update_state_after_alloc(self, request: Request, num_external_tokens: int) -> None: ...

    def request_finished(self, request: Request, block_ids: Sequence[int]) -> dict | None:
        """The `kv_transfer_params` to answer a finished request with (None: none)."""
        ...


TokenSampler = Callable[[Request], int]


def default_sampler(request: Request) -> int:
    """A deterministic 'greedy' token: a function of the request's prompt and position only."""
    return (request.seed * 2654435761 + 40503 * (len(request.output_token_ids) + 1)) % 151_936


@dataclass
class SchedulerConfig:
    max_num_batched_tokens: int
    max_num_seqs: int = 1024
    max_model_len: int = 200_000
    long_prefill_token_threshold: int = 0
    block_size: int = 16
    num_gpu_blocks: int = 44_597
    enable_prefix_caching: bool = True
    async_scheduling: bool = True

    def __post_init__(self) -> None:
        if self.max_num_batched_tokens < 1:
            raise ValueError(f"max_num_batched_tokens={self.max_num_batched_tokens} must be >= 1")
        if self.max_num_seqs < 1:
            raise ValueError(f"max_num_seqs={self.max_num_seqs} must be >= 1")


class Scheduler:
    """vLLM v1's Scheduler (+ AsyncScheduler when `async_scheduling`), FCFS policy."""

    def __init__(self, config: SchedulerConfig, sampler: TokenSampler = default_sampler,
                 connector: SchedulerConnector | None = None) -> None:
        self.config = config
        self.connector = connector
        self.finished_recving: set[str] = set()  # asynchronous loads the engine reported done
        self.kv = KVCacheManager(config.num_gpu_blocks, config.block_size, config.enable_prefix_caching)
        self.sampler = sampler
        self.requests: dict[str, Request] = {}
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.num_preemptions = 0
        self._step = 0
        self._arrivals = 0
        self._hash_memo: tuple[Sequence[int], tuple[int, ...]] | None = None

    # -- requests in and out ---------------------------------------------------------------

    def add_request(self, request_id: str, prompt_token_ids: Sequence[int], max_tokens: int,
                    kv_transfer_params: dict | None = None) -> Request:
        if request_id in self.requests:
            raise ValueError(f"request id {request_id!r} is already in the scheduler")
        if not prompt_token_ids:
            raise ValueError("a request needs at least one prompt token")
        if max_tokens < 1:
            raise ValueError(f"max_tokens={max_tokens} must be >= 1")
        request = Request(request_id, prompt_token_ids, max_tokens, arrival_index=self._arrivals,
                          kv_transfer_params=kv_transfer_params)
        self._arrivals += 1
        memo = self._hash_memo
        if memo is not None and memo[0] is prompt_token_ids:
            # D probes send one shared prompt object: its blocks are hashed once, not D times
            request.block_hashes = list(memo[1])
        elif len(prompt_token_ids) <= 8192:
            request.block_hashes = block_hashes(prompt_token_ids, self.config.block_size)
            self._hash_memo = (prompt_token_ids, tuple(request.block_hashes))
        self.requests[request_id] = request
        self.waiting.append(request)
        return request

    def finish_requests(self, request_ids: Iterable[str], status: RequestStatus) -> list[Request]:
        """Abort (or otherwise finish) requests from outside, e.g. a client that went away."""
        done = []
        for rid in request_ids:
            request = self.requests.get(rid)
            if request is None or request.status.finished:
                continue
            if request.status == RequestStatus.RUNNING:
                self.running.remove(request)
            else:
                self.waiting.remove(request)
                self.finished_recving.discard(rid)
            self._free_request(request, status)
            done.append(request)
        return done

    def _free_request(self, request: Request, status: RequestStatus) -> None:
        request.status = status
        self.kv.free(request)
        del self.requests[request.request_id]

    @property
    def num_running(self) -> int:
        return len(self.running)

    @property
    def num_waiting(self) -> int:
        return len(self.waiting)

    def has_requests(self) -> bool:
        return bool(self.running or self.waiting)

    # -- one step --------------------------------------------------------------------------

    def schedule(self) -> SchedulerOutput:
        cfg = self.config
        scheduled: list[ScheduledRequest] = []
        preempted: list[Request] = []
        # First, the RUNNING requests.
        budget = self._schedule_running(scheduled, preempted, cfg.max_num_batched_tokens)
        # Next, the WAITING requests (not when this step had to preempt).
        started_loads: list[Request] = []
        fill = 0
        if not preempted and self.connector is not None:
            fill = self._schedule_waiting_with_connector(scheduled, started_loads, budget)
            budget = cfg.max_num_batched_tokens - sum(e.num_new_tokens for e in scheduled)
        elif not preempted:
            budget = self._schedule_waiting(scheduled, budget)
        return self._output(scheduled, cfg.max_num_batched_tokens - budget, preempted, fill, started_loads)

    def _running_tokens(self, request: Request, budget: int) -> int:
        """The tokens a RUNNING request takes this step (0: none), within the budget, the long-prefill
        threshold and the model's length."""
        placeholders = request.num_output_placeholders
        computed = request.num_computed_tokens
        if placeholders > 0 and computed + 2 - placeholders >= request.num_prompt_tokens + request.max_tokens:
            return 0  # async: the step in flight already reaches max_tokens
        n = request.num_tokens + placeholders - computed
        threshold = self.config.long_prefill_token_threshold
        if 0 < threshold < n:
            n = threshold
        return min(n, budget, self.config.max_model_len - 1 - computed)

    def _schedule_running(self, scheduled: list[ScheduledRequest], preempted: list[Request], budget: int) -> int:
        """vLLM's RUNNING loop: each running request's tokens, preempting the last to arrive when
        the KV cache is full; returns the budget left."""
        running, kv = self.running, self.kv
        bs = kv.block_size
        req_blocks, num_cached = kv._req_blocks, kv._num_cached_blocks
        i = 0
        while i < len(running) and budget > 0:
            request = running[i]
            n = self._running_tokens(request, budget)
            if n <= 0:
                i += 1
                continue
            computed = request.num_computed_tokens
            # allocate_slots' no-op case inlined (a decode inside its last block): the common step
            blocks = req_blocks.get(request.request_id)
            end = computed + n
            if (blocks is not None and end <= len(blocks) * bs
                    and min(end, request.num_tokens) // bs <= num_cached.get(request.request_id, 0)):
                scheduled.append(ScheduledRequest(request, n, computed, not request.output_token_ids,
                                                  end >= request.num_tokens + request.num_output_placeholders))
                budget -= n
                i += 1
                continue
            if not self._allocate_or_preempt(request, n, preempted):
                break
            scheduled.append(self._entry(request, n, request.num_computed_tokens))
            budget -= n
            i += 1
        return budget

    def _allocate_or_preempt(self, request: Request, n: int, preempted: list[Request]) -> bool:
        """Slots for `n` more tokens of a running request, preempting from the back of the running
        queue (FCFS: the last to arrive goes first) until they fit; False when it was itself preempted."""
        while not self.kv.allocate_slots(request, n):
            victim = self.running.pop()
            self._preempt(victim)
            preempted.append(victim)
            if victim is request:
                return False
        return True

    def _schedule_waiting(self, scheduled: list[ScheduledRequest], budget: int) -> int:
        """vLLM's WAITING loop without a KV connector; returns the budget left."""
        cfg, kv = self.config, self.kv
        threshold = cfg.long_prefill_token_threshold
        while self.waiting and budget > 0:
            if len(self.running) == cfg.max_num_seqs:
                break
            request = self.waiting[0]
            if request.num_computed_tokens == 0:
                hit_blocks, hit_tokens = kv.get_computed_blocks(request)
            else:
                hit_blocks, hit_tokens = [], 0
            n = request.num_tokens - hit_tokens
            if 0 < threshold < n:
                n = threshold
            n = min(n, budget)
            if not kv.allocate_slots(request, n, hit_blocks, hit_tokens):
                break
            scheduled.append(self._admit(request, n, hit_tokens))
            budget -= n
        return budget

    def _output(self, scheduled: list[ScheduledRequest], total_tokens: int, preempted: Sequence[Request] = (),
                fill: int = 0, started_loads: Sequence[Request] = ()) -> SchedulerOutput:
        """The step's `SchedulerOutput` (vLLM's iteration-detail classes counted), its requests
        advanced (`_update_after_schedule`)."""
        self._step += 1
        ctx_requests = ctx_tokens = sampled = 0
        for entry in scheduled:
            if entry.is_context:
                ctx_requests += 1
                ctx_tokens += entry.num_new_tokens
            if entry.samples:
                sampled += 1
        output = SchedulerOutput(
            step_id=self._step,
            scheduled=tuple(scheduled),
            total_num_scheduled_tokens=total_tokens,
            preempted_request_ids=tuple(r.request_id for r in preempted),
            num_context_requests=ctx_requests,
            num_context_tokens=ctx_tokens,
            num_sampled=sampled,
            kv_fill_tokens=fill,
            started_loads=tuple(started_loads),
        )
        self._update_after_schedule(output)
        return output

    def _schedule_waiting_with_connector(self, scheduled: list[ScheduledRequest], started_loads: list[Request],
                                         budget: int) -> int:
        """vLLM's WAITING loop with a KV connector (module docs); returns the synchronous fill."""
        cfg, kv, connector = self.config, self.kv, self.connector
        assert connector is not None
        running = self.running
        threshold = cfg.long_prefill_token_threshold
        skipped: list[Request] = []
        fill = 0
        while self.waiting and budget > 0:
            if len(running) == cfg.max_num_seqs:
                break
            request = self.waiting[0]
            if request.status == RequestStatus.WAITING_FOR_REMOTE_KVS:
                if request.request_id not in self.finished_recving:
                    skipped.append(self.waiting.popleft())  # still loading: keeps its place, takes nothing
                    continue
                self._promote_remote(request)
            external, load_async = 0, False
            fresh = request.num_computed_tokens == 0
            if fresh:
                hit_blocks, hit_tokens = kv.get_computed_blocks(request)
                external, load_async = connector.get_num_new_matched_tokens(request, hit_tokens)
                computed = hit_tokens + external
            else:  # a promoted request: its KV arrived
                hit_blocks, hit_tokens = [], 0
                computed = request.num_computed_tokens
            if load_async:
                n = 0
            else:
                n = request.num_tokens - computed
                if 0 < threshold < n:
                    n = threshold
                n = min(n, budget)
            if not kv.allocate_slots(request, n, hit_blocks, computed if fresh else 0):
                break
            connector.update_state_after_alloc(request, external)
            self.waiting.popleft()
            if request.num_cached_tokens < 0:
                request.num_cached_tokens = hit_tokens
            if load_async:
                request.status = RequestStatus.WAITING_FOR_REMOTE_KVS
                request.num_computed_tokens = computed
                skipped.append(request)
                started_loads.append(request)
                continue
            running.append(request)
            request.status = RequestStatus.RUNNING
            request.num_computed_tokens = computed
            entry = self._entry(request, n, computed)
            if external:
                entry = ScheduledRequest(entry.request, entry.num_new_tokens, entry.num_computed_before,
                                         entry.is_context, entry.samples, external)
                fill += external
            scheduled.append(entry)
            budget -= n
        self.waiting.extendleft(reversed(skipped))
        return fill

    def _promote_remote(self, request: Request) -> None:
        """`_update_waiting_for_remote_kv`: the blocks are ready; a full prompt hit recomputes its
        last token (to sample the next one)."""
        self.finished_recving.discard(request.request_id)
        self.kv.cache_blocks(request, request.num_computed_tokens)
        if request.num_computed_tokens >= request.num_tokens:
            request.num_computed_tokens = request.num_tokens - 1
        request.status = RequestStatus.PREEMPTED if request.num_preemptions else RequestStatus.WAITING

    def finish_remote_load(self, request_id: str) -> bool:
        """The engine saw the asynchronous load of this request complete; False if it is gone."""
        request = self.requests.get(request_id)
        if request is None or request.status != RequestStatus.WAITING_FOR_REMOTE_KVS:
            return False
        self.finished_recving.add(request_id)
        return True

    @property
    def num_loading(self) -> int:
        """Requests waiting for their KV (WAITING_FOR_REMOTE_KVS)."""
        return sum(1 for r in self.waiting if r.status == RequestStatus.WAITING_FOR_REMOTE_KVS)

    def _admit(self, request: Request, n: int, hit_tokens: int) -> ScheduledRequest:
        """Move the head of the waiting queue to the running list, its prefix-cache hit already
        computed; its entry in this step (`n` new tokens)."""
        self.waiting.popleft()
        self.running.append(request)
        request.status = RequestStatus.RUNNING
        request.num_computed_tokens = hit_tokens
        if request.num_cached_tokens < 0:
            request.num_cached_tokens = hit_tokens
        return self._entry(request, n, hit_tokens)

    @staticmethod
    def _entry(request: Request, n: int, computed_before: int) -> ScheduledRequest:
        samples = computed_before + n >= request.num_tokens + request.num_output_placeholders
        return ScheduledRequest(request, n, computed_before, not request.output_token_ids, samples)

    def _update_after_schedule(self, output: SchedulerOutput) -> None:
        placeholders = self.config.async_scheduling
        for entry in output.scheduled:
            request = entry.request
            request.num_computed_tokens += entry.num_new_tokens
            request.is_prefill_chunk = not entry.samples
            if entry.samples and placeholders:
                request.num_output_placeholders += 1

    def _preempt(self, request: Request) -> None:
        self.kv.free(request)
        request.status = RequestStatus.PREEMPTED
        request.num_computed_tokens = 0
        request.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.appendleft(request)

    def update_from_output(self, output: SchedulerOutput) -> list[RequestOutput]:
        """The step finished: each request that sampled gets its token; stopped ones are freed."""
        outs: list[RequestOutput] = []
        cfg = self.config
        async_sched = cfg.async_scheduling
        max_model_len = cfg.max_model_len
        running_status, finished_from = RequestStatus.RUNNING, RequestStatus.FINISHED_STOPPED
        requests = self.requests
        sampler = self.sampler
        kv = self.kv
        cache_blocks, num_cached, bs, caching = kv.cache_blocks, kv._num_cached_blocks, kv.block_size, kv.enable_caching
        finished: list[Request] = []
        for entry in output.scheduled:
            if not entry.samples:
                continue  # a prefill chunk: nothing sampled
            request = entry.request
            if request.status >= finished_from or request.request_id not in requests:
                continue  # finished or aborted while the step ran
            token = sampler(request)
            request.output_token_ids.append(token)
            request.num_tokens += 1  # Request.append_output, inlined
            if async_sched and request.num_output_placeholders > 0:
                request.num_output_placeholders -= 1
            n_out = len(request.output_token_ids)
            if n_out >= request.max_tokens or request.num_tokens >= max_model_len:
                finished.append(request)
                params = (self.connector.request_finished(request, kv.blocks_of(request.request_id))
                          if self.connector is not None else None)
                outs.append(RequestOutput(request.request_id, (token,), n_out, "length", params))
                continue
            if caching and request.status == running_status:
                known = request.num_computed_tokens - request.num_output_placeholders
                if min(known, request.num_tokens) // bs > num_cached.get(request.request_id, 0):
                    cache_blocks(request, known)  # a block filled up with sampled tokens
            outs.append(RequestOutput(request.request_id, (token,), n_out, None))
        if finished:
            done = set(map(id, finished))
            self.running = [r for r in self.running if id(r) not in done]
            for request in finished:
                if request.status != running_status and request in self.waiting:
                    self.waiting.remove(request)
                self._free_request(request, RequestStatus.FINISHED_LENGTH_CAPPED)
        return outs
