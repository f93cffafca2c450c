"""SGLang's batch policy (0.5.15), reproduced as pure code on the embedded engine's KV blocks.

What it mirrors (`python/sglang/srt/managers/scheduler.py`: `get_next_batch_to_run`,
`_get_new_batch_prefill_raw`; `schedule_policy.py`: `PrefillAdder.add_chunked_req`,
`add_one_req`): a step is a prefill batch whenever one can be formed ("Run prefill first if
possible"), else a decode batch of every running request.

- A prefill batch takes the request whose prompt is half done first (SGLang's `chunked_req`:
  its next chunk goes into every batch until its last), then waiting requests in order, up to
  `max_num_batched_tokens` new tokens (SGLang's `--chunked-prefill-size` B): a request that does
  not fit whole takes what is left of B and becomes the half-done one.
- Default (`mixed_chunk` False): the running decodes pause for the prefill batch. A P-token
  prompt beside them runs as ceil(P / B) steps of B tokens back to back, then their next step.
- `--enable-mixed-chunk` (`mixed_chunk` True): the running decodes join the prefill batch
  (`mix_with_running`), one token each, and the prefill gets B minus their number
  (`rem_chunk_tokens -= running_bs`): ceil(P / (B - D)) steps of B - D tokens, vLLM's shape.

Everything else (KV blocks, prefix cache hits, the async-scheduling placeholders that model
SGLang's overlap scheduler, which prepares step N+1 while step N runs) is `Scheduler`'s. SGLang's
retraction of decodes under KV pressure is not modelled: a decode that cannot get a block waits
a step. The step-time model prices each step from what it carries, so a prefill-only step has no
decode tokens in it.
"""

from __future__ import annotations

from collections.abc import Sequence

from pdexporter.sim.scheduler import (
    Request,
    ScheduledRequest,
    Scheduler,
    SchedulerConfig,
    SchedulerOutput,
    TokenSampler,
    default_sampler,
)

__all__ = ["SglangScheduler"]


class SglangScheduler(Scheduler):
    """SGLang's policy (module docs) on `Scheduler`'s blocks and requests."""

    def __init__(
        self, config: SchedulerConfig, sampler: TokenSampler = default_sampler, *, mixed_chunk: bool = False
    ) -> None:
        super().__init__(config, sampler)
        self.mixed_chunk = mixed_chunk

    def schedule(self) -> SchedulerOutput:
        prefill = self._prefill_batch()
        if prefill is not None:
            return prefill
        # A decode batch: vLLM's running loop serves every running request one token (no request
        # is mid-prefill and none waiting can be admitted, so it admits none either).
        return super().schedule()

    def _prefill_batch(self) -> SchedulerOutput | None:
        cfg = self.config
        running = self.running
        half_done = [r for r in running if r.num_computed_tokens < r.num_prompt_tokens]
        decodes = [r for r in running if r.num_computed_tokens >= r.num_prompt_tokens]
        if not half_done and not (self.waiting and len(running) < cfg.max_num_seqs):
            return None
        budget = cfg.max_num_batched_tokens - (len(decodes) if self.mixed_chunk else 0)
        if budget <= 0:
            return None  # the mixed decodes take the whole budget: SGLang forms no prefill batch
        scheduled: list[ScheduledRequest] = []
        for request in half_done:
            n = min(request.num_prompt_tokens - request.num_computed_tokens, budget)
            if n <= 0 or not self.kv.allocate_slots(request, n):
                continue
            scheduled.append(self._entry(request, n, request.num_computed_tokens))
            budget -= n
        chunking = any(
            e.num_computed_before + e.num_new_tokens < e.request.num_prompt_tokens for e in scheduled
        )
        kv = self.kv
        while self.waiting and budget > 0 and not chunking and len(running) < cfg.max_num_seqs:
            request = self.waiting[0]
            hit_blocks, hit_tokens = (
                kv.get_computed_blocks(request) if request.num_computed_tokens == 0 else ([], 0)
            )
            remaining = request.num_tokens - hit_tokens
            n = min(remaining, budget)
            if not kv.allocate_slots(request, n, hit_blocks, hit_tokens):
                break
            scheduled.append(self._admit(request, n, hit_tokens))
            budget -= n
            chunking = n < remaining  # it is the half-done request from now on
        if not scheduled:
            return None
        if self.mixed_chunk:
            for request in decodes:
                entry = self._decode_entry(request)
                if entry is not None:
                    scheduled.append(entry)
        return self._output(scheduled, sum(e.num_new_tokens for e in scheduled))

    def _output(
        self,
        scheduled: list[ScheduledRequest],
        total_tokens: int,
        preempted: Sequence[Request] = (),
        fill: int = 0,
        started_loads: Sequence[Request] = (),
    ) -> SchedulerOutput:
        """SGLang's classes for its step log: a request's prompt tokens make a prefill batch
        ("context"), anything else is a decode, also the first decode of a request whose first
        token is not out yet (vLLM counts that one as context)."""
        entries = [
            e
            if e.is_context == (e.num_computed_before < e.request.num_prompt_tokens)
            else ScheduledRequest(
                e.request,
                e.num_new_tokens,
                e.num_computed_before,
                e.num_computed_before < e.request.num_prompt_tokens,
                e.samples,
                e.num_external_tokens,
            )
            for e in scheduled
        ]
        return super()._output(entries, total_tokens, preempted, fill, started_loads)

    def _decode_entry(self, request: Request) -> ScheduledRequest | None:
        """A running decode's one token in a mixed step (None: it has nothing to compute now)."""
        placeholders = request.num_output_placeholders
        computed = request.num_computed_tokens
        if placeholders > 0 and computed + 2 - placeholders >= request.num_prompt_tokens + request.max_tokens:
            return None  # async: the step in flight already reaches max_tokens
        n = min(request.num_tokens + placeholders - computed, self.config.max_model_len - 1 - computed)
        if n <= 0 or not self.kv.allocate_slots(request, n):
            return None
        return ScheduledRequest(
            request,
            n,
            computed,
            not request.output_token_ids,
            computed + n >= request.num_tokens + placeholders,
        )
