"""A window the engine's own step log shows beside other requests than the D probes
(`measure.protocol.logged_injection_problem`): refused by a sweep, left out of every aggregate of a
record that holds one (`RepRecord.counted`). Real windows: SGLang 0.5.15 with FlashAttention 3, mixed
mode, GPU session 13 (the committed raw files)."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

from pdexporter.analysis.table import samples_from_record
from pdexporter.engines import IterationStep, adapter
from pdexporter.measure.protocol import chunk_plan, chunks_from_steps, logged_injection_problem
from pdexporter.measure.records import aggregate
from pdexporter.measure.store import ResultsStore

RUN = Path(__file__).resolve().parents[3] / "results" / "h200-sglang0.5.15-fa3-mixed-qwen3-coder-30b-a3b"


def _steps(rep: int) -> list[IterationStep]:
    raw = json.loads(gzip.decompress((RUN / "8192" / "raw" / f"D12_P8192_r{rep}.json.gz").read_bytes()))
    return adapter("sglang-mixed").parse_step_log(raw["engine_steps"])


def test_the_log_tells_a_window_beside_a_stale_probe_set_from_the_others() -> None:
    assert logged_injection_problem(_steps(0), 12) is None
    assert logged_injection_problem(_steps(1), 12) is None
    assert logged_injection_problem(_steps(2), 12) == (
        "the engine's step log shows 24 requests decoding in the step before the prefill's first chunk "
        "(expected the 12 probes)")


def test_nothing_is_claimed_where_the_log_shows_no_decode_step_before_the_prefill() -> None:
    chunk = IterationStep(7, 1, 1024, 4, 4, 60.0)
    decode = IterationStep(6, 0, 0, 4, 4, 15.0)
    assert logged_injection_problem(None, 4) is None
    assert logged_injection_problem([chunk], 4) is None  # the chunk step was the first logged
    assert logged_injection_problem([decode, chunk], 4) is None
    assert logged_injection_problem([decode, chunk], 0) is None  # no probes, nothing to compare
    assert logged_injection_problem([IterationStep(6, 0, 0, 5, 5, 15.0), chunk], 4) is not None


def test_a_repetition_beside_other_requests_is_kept_but_not_aggregated() -> None:
    record = next(r for r in ResultsStore(RUN).iter_records() if r.key == (8192, 12, 8192))
    busy = [r for r in record.reps if not r.counted]
    assert [r.rep for r in busy] == [2] and "24 requests" in busy[0].interference.injection_check
    assert len(record.reps) == 3  # kept, with the reason
    penalties = sorted(r.derived.tpot_penalty_ms for r in record.reps if r.counted)
    assert busy[0].derived.tpot_penalty_ms > 5 * max(penalties)  # what it would have added: 709 ms
    again = aggregate(record.config, record.reps)
    assert again.derived.tpot_penalty_ms == sum(penalties) / 2  # the median of the two counted
    assert again.summary is not None and again.summary.cv_tpot_penalty < 0.15
    sample = samples_from_record(record)
    assert len(sample.reps) == 2


def test_a_prefill_step_after_the_prompt_is_complete_is_not_its_chunk() -> None:
    """`chunks_from_steps` with the prompt's tokens: a probe's 16-token re-prompt logged after a 3000-token prompt's
    two chunks (read with the window's steps when the log was read late, a loaded host: an e2e run's record once
    said [2046, 954, 16]) is not one of its chunks, and the window maths is told two (`chunk_plan`); where the
    chunks never add up to the prompt (a cached prefix), every one is kept."""
    decode = IterationStep(1, 0, 0, 2, 2, 10.0)
    steps = [decode, IterationStep(2, 1, 2046, 2, 2, 60.0), IterationStep(3, 1, 954, 2, 2, 30.0), decode,
             IterationStep(5, 1, 16, 2, 2, 11.0)]
    assert chunks_from_steps(steps) == (2046, 954, 16)  # the log as it is
    assert chunks_from_steps(steps, 3000) == (2046, 954)
    plan = chunk_plan("vllm", steps, None, 3000)
    assert plan is not None and plan.exact and plan.sizes == (2046, 954)
    assert chunks_from_steps(steps[:3], 4096) == (2046, 954)  # short of the prompt: a cached prefix, all kept
    assert chunks_from_steps([decode], 3000) is None
