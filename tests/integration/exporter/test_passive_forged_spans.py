"""Forged request spans cannot suppress passive mode's detections (issue 24).

Anyone who reaches the trace receiver can post a span claiming a request whose first token fell
in any run the probes saw. In the audit, such spans turned 551 detected prefills into `merged`
(several prefills in one run: counted, never published). The engine's own /metrics counters now
outrank the spans (`PassiveTracker._attribute`): where a pair of scrapes brackets the run and the
counters say one production prefill ended in it, a second span is not believed. Here every batch
of the embedded engine's real spans (virtual time, `predict.passive`) carries a forged twin of each
production span, 2 ms later. Before: all 24 published events of the honest session became
`merged`. Now the bracketed ones (16 of 24 at this scrape interval) are published as without
forgery, and no published event is attributed to a forged request. Where no pair of scrapes
isolates a run, spans are all there is: docs/security.md says why the receiver takes a token.
"""

from __future__ import annotations

import dataclasses

import pytest

import pdexporter.predict.passive as sim_passive
from pdexporter._internal.vloop import run_virtual
from pdexporter.client.traces import RequestTrace, decode_traces
from pdexporter.load.mix import LoadSpec
from pdexporter.predict.passive import passive_session

pytestmark = pytest.mark.integration

LOAD = LoadSpec(rate=0.5, duration_s=60, seed=7)


def _forging(body: bytes, **kwargs: object) -> list[RequestTrace]:
    real = decode_traces(body, **kwargs)  # type: ignore[arg-type]
    forged = [
        dataclasses.replace(
            t,
            request_id=f"forged-{t.request_id}",
            start_ns=t.start_ns + 2_000_000,
            end_ns=t.end_ns + 2_000_000,
            prompt_tokens=777,
        )
        for t in real
        if t.prompt_tokens != 4096
    ]  # the production requests' (the probes' are 4096)
    return real + forged


def test_forged_twin_spans_do_not_turn_prefills_into_merged_events(monkeypatch: pytest.MonkeyPatch) -> None:
    honest = run_virtual(
        passive_session("h200-qwen3-coder-30b-a3b", 8192, LOAD, probes=4, scrape_interval_s=0.25)
    )
    monkeypatch.setattr(sim_passive, "decode_traces", _forging)
    forged = run_virtual(
        passive_session("h200-qwen3-coder-30b-a3b", 8192, LOAD, probes=4, scrape_interval_s=0.25)
    )
    assert len(honest.published) >= 15, honest.outcomes
    assert len(forged.published) >= 0.6 * len(honest.published), (honest.outcomes, forged.outcomes)
    honest_p = {e.attribution.prompt_tokens for e in honest.published}
    for event in forged.published:
        assert not any(rid.startswith("forged-") for rid in event.attribution.request_ids)
        assert event.attribution.prompt_tokens in honest_p  # the real request's P, never the forged 777
