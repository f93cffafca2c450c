"""Where the decodes paused for a prefill (SGLang's default), the window maths' one "chunk step" is
their whole stall: found on the shape SGLang 0.5.15 gave on the H200, and on its committed records.

On the H200 (results/h200-sglang0.5.15-qwen3-coder-30b-a3b) a long prompt showed the decodes two
gaps: one of 58 to 104 ms a few ms after the injection (the overlap scheduler launching the first
chunk eagerly while it holds the previous decode step's tokens), one token, then the stall of all
the chunk steps, which at P = 32768 ended 21 to 24 ms (three to four decode steps) after the
prefill's first token. A rule that looked for the stall's end only up to two steps after the first
token found nothing there and took the first gap instead: 52 to 93 ms where the decodes waited
3.1 to 3.2 s.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from pdexporter.measure.protocol import StreamTrace, analyse_traces, window_anchor_ns
from pdexporter.measure.window import BaselineStats, WindowParams, baseline_stats

MS = 1_000_000
STEP_MS = 6.6
SGLANG = Path(__file__).parents[3] / "results" / "h200-sglang0.5.15-qwen3-coder-30b-a3b"


def h200_shape(stall_end_after_first_ms: float, d: int = 4) -> tuple[list[StreamTrace], int, int]:
    """Decode steps of 6.6 ms; the prefill sent at t = 0; a 64 ms launch gap from 6 ms; the stall
    of the chunk steps; the first token at 3267 ms; the stall ending `stall_end_after_first_ms`
    after it; decode steps again."""
    t_first = 3267 * MS
    before = list(np.arange(-60, 1) * STEP_MS * MS + 6 * MS)  # ..., -0.6 ms, 6 ms
    launch_end = 70 * MS
    resume = int(t_first + stall_end_after_first_ms * MS)
    after = [resume + int(i * STEP_MS * MS) for i in range(40)]
    times = [int(t) for t in before] + [launch_end] + after
    traces = [
        StreamTrace(f"probe-{i}", "probe", times[0] - MS, [t + i * 20_000 for t in times], [1] * len(times))
        for i in range(d)
    ]
    return traces, 0, t_first


def baseline(d: int = 4) -> BaselineStats:
    steps = np.cumsum(np.full(256, STEP_MS * MS))
    stats = baseline_stats([steps + i * 20_000 for i in range(d)])
    assert stats is not None
    return stats


@pytest.mark.parametrize("late_ms", [-3.0, 9.0, 22.0, 60.0])
def test_the_anchor_is_the_end_of_the_stall_that_spans_the_first_token(late_ms: float) -> None:
    traces, t_inject, t_first = h200_shape(late_ms)
    base = baseline()
    anchor = window_anchor_ns("sglang", t_first, base, traces)
    assert anchor == pytest.approx(t_first + late_ms * MS, abs=0.1 * MS)
    window = analyse_traces(
        traces, t_inject, t_first, base, WindowParams(), schedule=(8192,) * 4, engine="sglang"
    )
    # the one step the decodes see is the stall (3.2 s), never the 64 ms launch gap before it
    assert window.chunk_step_times_ms == pytest.approx((3197 + late_ms,), abs=0.5)
    assert window.prefill_duration_ms == pytest.approx(3267.0)


def test_where_the_decodes_share_the_chunk_step_the_anchor_is_the_first_token() -> None:
    traces, _, t_first = h200_shape(22.0)
    assert window_anchor_ns("sglang-mixed", t_first, baseline(), traces) == t_first
    assert window_anchor_ns("vllm", t_first, baseline(), traces) == t_first


def test_without_a_baseline_or_probes_the_anchor_is_the_first_token() -> None:
    traces, _, t_first = h200_shape(22.0)
    assert window_anchor_ns("sglang", t_first, None, traces) == t_first
    assert window_anchor_ns("sglang", t_first, baseline(), []) == t_first


@pytest.mark.skipif(not SGLANG.is_dir(), reason="the SGLang H200 results are not in this checkout")
def test_committed_h200_records_put_a_long_prefill_in_the_stall() -> None:
    """Every repetition at P = 32768: the located stall is at least 95 % of the prefill's time to
    first token (measured: 97.3 to 98.6 %), and no repetition's stall is longer than its time to
    first token plus four decode steps."""
    long_ones = 0
    for path in sorted(SGLANG.glob("8192/D*_P*.json")):
        record = json.loads(path.read_text())
        step, p = record["baseline"]["tpot_p50_ms"], record["config"]["new_prefill_tokens"]
        for rep in record["reps"]:
            stall, ttft = (
                rep["interference"]["chunk_step_times_ms"][0],
                rep["interference"]["prefill_duration_ms"],
            )
            assert stall <= ttft + 4 * step, (path.name, rep["rep"], stall, ttft)
            if p == 32768:
                long_ones += 1
                assert stall >= 0.95 * ttft, (path.name, rep["rep"], stall, ttft)
    assert long_ones == 12
