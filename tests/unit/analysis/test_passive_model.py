"""The event-fitted passive model (analysis.passive_model) on events drawn from a known cost model:
the fit finds it, its intervals narrow as events come, reach says why a cell is out."""

from __future__ import annotations

import math

import numpy as np
import pytest

from pdexporter.analysis.models import ContextAwareModel, attention_pairs, chunk_schedule, stream_pairs
from pdexporter.analysis.passive_model import (
    FitEvent,
    Grid,
    answer,
    cells,
    decision_inputs,
    event_fit_data,
    events_from_records,
    fit_passive_model,
    halfwidth,
    injected_errors,
    injected_reps,
    joint_prompts,
    launch_levels,
    level_matched,
    passive_decision,
    reach,
    recent_levels,
    traffic_seconds,
)

B = 8192
TRUE = ContextAwareModel(45.0, 0.3, 0.0006, 1.5e-6, sigma0_ms=3.0, sigma1_ms_per_token=0.0004,
                         kappa_graph_ms_per_token=0.03)
GRID = Grid((B,))


def _events(
    n: int, seed: int = 0, noise: float = 0.05, d_range: tuple[int, int] = (3, 13), p_max: int = 20000
) -> list[FitEvent]:
    """Events whose chunk steps cost what TRUE says (each step: baseline + pi_k, with multiplicative
    noise), arriving one every 1.5 s, prompts log-uniform from 600 tokens."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        d = int(rng.integers(d_range[0], d_range[1] + 1))
        p = int(np.exp(rng.uniform(np.log(600), np.log(p_max))))
        chunks = np.asarray(chunk_schedule(p, B, d), np.float64)
        pi = TRUE.chunk_penalties_ms(d, chunks) * rng.normal(1.0, noise, chunks.size)
        base = 6.0
        total = float(pi.sum() + TRUE.sigma0_ms + TRUE.sigma1_ms_per_token * p) * rng.normal(1.0, noise / 2)
        out.append(FitEvent(B, d, p, total, base, tuple(float(x) for x in base + pi), 1.5 * i, "otlp"))
    return out


def test_event_points_carry_exact_d_and_p_and_their_steps() -> None:
    events = _events(5)
    data = event_fit_data(events)
    assert data.decode.tolist() == [e.decode for e in events]
    assert data.prefill.tolist() == [e.prompt for e in events]
    assert np.allclose(data.cost_ms, [e.decode * e.total_ms for e in events])
    assert data.steps[0] == ((6.0, events[0].chunk_steps_ms),)
    assert attention_pairs(1, 0) == 1.0  # the q_k the fit's rows use


def test_the_fit_finds_the_cost_model_the_events_came_from() -> None:
    events = _events(300, noise=0.03)
    model = fit_passive_model(events, GRID, bootstrap=20)
    assert model is not None and model.events == 300 and model.left_out == 0
    m = model.model
    assert m.alpha0_ms == pytest.approx(TRUE.alpha0_ms, rel=0.05)
    assert m.beta_ms_per_token_pair == pytest.approx(TRUE.beta_ms_per_token_pair, rel=0.05)
    for d, p in ((4, 1024), (8, 8192), (12, 16384)):
        truth = float(TRUE.predict(d, p, B))
        assert float(model.predict(d, p, B)) == pytest.approx(truth, rel=0.05)
        low, high = model.interval(d, p, B)
        assert low <= float(model.predict(d, p, B)) <= high


def test_intervals_narrow_as_events_come() -> None:
    events = _events(640, seed=3, noise=0.15)
    widths = []
    for n in (40, 160, 640):
        model = fit_passive_model(events[:n], GRID, bootstrap=25)
        assert model is not None
        widths.append(halfwidth(cells(model, events[:n], GRID)))
    assert widths[0] > widths[1] > widths[2], widths
    assert widths[2] < widths[0] / 2  # 16x the events: about a quarter of the width


def test_events_below_the_grid_prompt_span_are_left_out() -> None:
    small = [FitEvent(B, 4, 200, 4.0, 6.0, (10.0,), 0.0)] * 7
    model = fit_passive_model(_events(60) + small, GRID, bootstrap=5)
    assert model is not None and model.events == 60 and model.left_out == 7


def test_reach_says_why_a_cell_is_out() -> None:
    events = _events(300, d_range=(4, 9), p_max=12000)
    why = reach(events, GRID)
    assert why[(B, 4, 2048)] is None and why[(B, 8, 8192)] is None
    assert "below the decodes the engine ran" in why[(B, 1, 2048)]
    assert "beyond the concurrency" in why[(B, 12, 2048)]
    assert "beyond the published events' prompts" in why[(B, 6, 32768)]
    assert "D = 1" in why[(B, 1, 32768)] and "P = 32768" in why[(B, 1, 32768)]
    assert "no event at B = 2048" in reach(events, Grid((2048,)))[(2048, 4, 2048)]


def test_errors_against_the_injected_table_use_the_reached_cells_only() -> None:
    events = _events(300, d_range=(4, 9), p_max=12000)
    model = fit_passive_model(events, GRID, bootstrap=20)
    assert model is not None
    rows = cells(model, events, GRID)
    truth = {c.key: float(TRUE.predict(c.key[1], c.key[2], B)) for c in rows}
    errors = injected_errors(rows, truth)
    assert errors.cells == sum(c.reached for c in rows) and errors.mape is not None and errors.mape < 0.05
    off = {k: v * 1.3 for k, v in truth.items()}
    assert injected_errors(rows, off).mape == pytest.approx(1 - 1 / 1.3, abs=0.05)
    # coverage: the truth lies inside the (bootstrap) intervals of most reached cells, 30 % off it lies in none
    assert errors.with_interval == errors.cells and errors.inside >= 0.7 * errors.cells
    far = injected_errors(rows, off)
    assert far.inside == 0 and far.coverage == f"0/{far.with_interval}"
    assert errors.to_dict()["inside_interval"] == errors.inside


def test_answer_converges_and_gives_a_passive_decision() -> None:
    events = _events(600, noise=0.1)  # 15 minutes at one event per 1.5 s
    truth = {k: float(TRUE.predict(k[1], k[2], B)) for k in GRID.cells()}
    result = answer(events, GRID, injected=truth, minutes=(1.0, 5.0), bootstrap=20)
    assert result is not None
    assert [c.minutes for c in result.convergence] == [1.0, 5.0, 14.97]
    assert [c.events for c in result.convergence] == [41, 201, 600]
    assert result.convergence[-1].errors is not None and result.convergence[-1].errors.mape < 0.05
    assert "below the decodes the engine ran" in result.not_reached
    doc = passive_decision(result, 50.0, modelled=True, engine="pdexporter-sim")
    assert doc["mode"] == "passive" and doc["passive"]["events_used"] == 600
    assert doc["valid_range"]["decode_batch_size"][0] == 4  # D = 1, 2 are not reached
    assert doc["thresholds_min_prefill_tokens"][str(B)]
    report, table = decision_inputs(result.model, result.cells, True, "pdexporter-sim")
    assert report.best.model is result.model.model and len(table) == sum(c.reached for c in result.cells)


def test_the_campaign_variation_widens_the_cells_intervals_by_regime_and_not_the_convergence() -> None:
    from pdexporter.analysis.decision_eval import chunk_context, cost_regime

    events = _events(300, noise=0.03)
    variation = {"colocated": {"log_sd": 0.2, "by_regime": {"launch": 0.3, "compute": 0.1, "graph": 0.5}}}
    plain = answer(events, GRID, minutes=(), bootstrap=40)
    carried = answer(events, GRID, minutes=(), bootstrap=40, variation=variation)
    assert plain is not None and carried is not None
    assert not plain.summary()["intervals_carry_campaign_variation"]
    assert carried.summary()["intervals_carry_campaign_variation"]
    doc = carried.model.model.document()
    for a, b in zip(plain.cells, carried.cells):
        assert a.key == b.key and a.aggregate_ms == b.aggregate_ms  # the central number does not move
        assert b.low_ms is not None and b.high_ms is not None and a.low_ms is not None and a.high_ms is not None
        s = variation["colocated"]["by_regime"][cost_regime(doc, chunk_context(doc, b.key[1], b.key[2], B))]
        # the events alone pin the model to ~1 %; with the variation the 95 % interval spans ~ +-1.96 s
        assert math.log(b.high_ms / b.low_ms) == pytest.approx(2 * 1.96 * s, rel=0.15), b.key
        assert b.high_ms - b.low_ms > 3 * (a.high_ms - a.low_ms)
    assert carried.convergence[-1].halfwidth == plain.convergence[-1].halfwidth  # the events' own width


def test_too_few_events_give_no_model() -> None:
    assert fit_passive_model(_events(3), GRID) is None
    assert answer([], GRID) is None


def test_events_from_records_take_the_exact_d_and_p_and_traffic_time() -> None:
    from types import SimpleNamespace as NS

    def rep(at: str, d: int, p: int, prefills: int = 1) -> NS:
        return NS(
            model_extra={
                "passive": {
                    "decode_batch_size": d,
                    "prompt_tokens": p,
                    "prefills": prefills,
                    "source": "otlp",
                }
            },
            derived=NS(total_interference_ms=50.0),
            baseline=NS(tpot_p50_ms=6.0),
            interference=NS(chunk_step_times_ms=[56.0]),
            started_at=at,
        )

    record = NS(
        config=NS(mode="passive", chunk_size=B),
        reps=[
            rep("2026-01-01T00:01:00+00:00", 7, 900),
            rep("2026-01-01T00:00:00+00:00", 5, 1500),
            rep("2026-01-01T00:02:00+00:00", 5, 1500, prefills=2),
        ],
    )
    active = NS(config=NS(mode="active", chunk_size=B), reps=[rep("2026-01-01T00:00:00+00:00", 4, 512)])
    events = events_from_records([record, active])
    assert [(e.decode, e.prompt, e.at_s) for e in events] == [(5, 1500, 0.0), (7, 900, 60.0)]
    assert events[0].chunk_steps_ms == (56.0,) and events[0].source == "otlp"
    # a spread run: traffic ran 00:00:00-00:00:30 and from 00:00:50 on (an injected block between):
    # the event at 00:01:00 is 40 s of traffic after the first, not 60
    from pdexporter._internal.durations import iso_epoch_s

    t0 = iso_epoch_s("2026-01-01T00:00:00+00:00")
    spans = [(t0, t0 + 30.0), (t0 + 50.0, t0 + 600.0)]
    assert traffic_seconds(t0 + 60.0, spans) == 40.0 and traffic_seconds(t0 + 40.0, spans) == 30.0
    spread = events_from_records([record], spans=spans)
    assert [(e.decode, e.at_s) for e in spread] == [(5, 0.0), (7, 40.0)]
    # origin 0: each event's own start, epoch s (passive_spread.py places them in its segments)
    assert [e.at_s for e in events_from_records([record], origin=0.0)] == [t0, t0 + 60.0]


def test_spread_segments_read_the_passive_segments_and_name_a_bad_line(tmp_path) -> None:
    import pytest

    from pdexporter.analysis.passive_compare import spread_segments
    from pdexporter.errors import RecordError

    tsv = tmp_path / "spread.tsv"
    tsv.write_text("segment\t1\t100\t160\t0\nblock\t1\t161\t250\t0\nsegment\t2\t251\t311\t0\n")
    assert spread_segments(tsv) == [(100.0, 160.0), (251.0, 311.0)]
    tsv.write_text("segment\t1\t100\t160\t0\nsegment\t2\tnoon\t311\t0\n")
    with pytest.raises(RecordError, match=r"spread.tsv:2: a segment line"):
        spread_segments(tsv)
    tsv.write_text("block\t1\t161\t250\t0\n")
    with pytest.raises(RecordError, match="no segment lines"):
        spread_segments(tsv)


def test_joint_events_are_counted_apart_and_widen_the_cells_they_stand_in() -> None:
    import dataclasses

    plain = _events(200, seed=3)
    joint = [dataclasses.replace(e, prefills=3) if i % 4 == 0 else e for i, e in enumerate(plain)]
    model = fit_passive_model(plain, GRID, bootstrap=20)
    assert model is not None
    before = {c.key: c for c in cells(model, plain, GRID)}
    after = {c.key: c for c in cells(model, joint, GRID)}
    assert sum(c.joint_events for c in after.values()) == sum(e.prefills > 1 for e in joint if e.prompt >= 512) > 0
    assert all(c.joint_events == 0 for c in before.values())
    for key, c in after.items():
        b = before[key]
        assert c.events == b.events and c.aggregate_ms == b.aggregate_ms  # counts and the estimate unchanged
        assert c.low_ms is not None and b.low_ms is not None and c.high_ms is not None and b.high_ms is not None
        assert c.low_ms <= b.low_ms and c.high_ms >= b.high_ms
        if c.joint_events:
            assert c.high_ms - c.low_ms > b.high_ms - b.low_ms


FAST = ContextAwareModel(25.0, 0.3, 0.0006, 1.5e-6, sigma0_ms=3.0, sigma1_ms_per_token=0.0004)
SLOW = ContextAwareModel(60.0, 0.3, 0.0006, 1.5e-6, sigma0_ms=3.0, sigma1_ms_per_token=0.0004)


def _two_level_events(n: int, seed: int = 0) -> list[FitEvent]:
    """TRUE's events, but the launch-bound one-chunk prompts (600-2000 tokens) ran at the host's
    fast launch level (alpha0 25 ms) in the odd events and its slow one (alpha0 60 ms) in the even
    ones; every third a prompt of two or three chunks (9000-20000 tokens) as TRUE says."""
    rng = np.random.default_rng(seed)
    fast, slow = FAST, SLOW
    out = []
    for i in range(n):
        d = int(rng.integers(3, 14))
        small = i % 3 != 2
        p = int(np.exp(rng.uniform(np.log(600 if small else 9000), np.log(2000 if small else 20000))))
        truth = (fast if i % 2 else slow) if small else TRUE
        chunks = np.asarray(chunk_schedule(p, B, d), np.float64)
        pi = truth.chunk_penalties_ms(d, chunks) * rng.normal(1.0, 0.03, chunks.size)
        total = float(pi.sum() + truth.sigma0_ms + truth.sigma1_ms_per_token * p)
        out.append(FitEvent(B, d, p, total, 6.0, tuple(float(x) for x in 6.0 + pi), 1.5 * i, "otlp"))
    return out


def test_launch_levels_split_the_one_chunk_events_and_a_level_fit_predicts_that_level() -> None:
    events = _two_level_events(240)
    levels = launch_levels(events, GRID)
    assert levels.split and levels.separation is not None and levels.separation > 2
    assert levels.fast_ms == pytest.approx(25.0 + 0.3 * 8, abs=4.0)
    assert levels.slow_ms == pytest.approx(60.0 + 0.3 * 8, abs=4.0)
    small = {i for i, e in enumerate(events) if e.prompt < 2000}
    assert levels.slow == {i for i in small if i % 2 == 0}  # the slow events, and only they
    assert levels.fast == {i for i in small if i % 2 == 1}
    mixed = fit_passive_model(events, GRID, bootstrap=5)
    slow = fit_passive_model(events, GRID, bootstrap=5, launch_level="slow")
    fast = fit_passive_model(events, GRID, bootstrap=5, launch_level="fast")
    assert mixed is not None and slow is not None and fast is not None
    assert slow.launch_level == "slow" and slow.levels == levels and slow.left_out == len(levels.fast)
    d, p = 8, 1024
    at = {name: float(m.predict(d, p, B)) for name, m in (("mixed", mixed), ("slow", slow), ("fast", fast))}
    pi_slow, pi_fast = 60.0 + 0.3 * d, 25.0 + 0.3 * d
    assert at["fast"] < at["mixed"] < at["slow"]
    assert at["slow"] == pytest.approx(d * (pi_slow + 3.0 + 0.0004 * p), rel=0.1)
    assert at["fast"] == pytest.approx(d * (pi_fast + 3.0 + 0.0004 * p), rel=0.1)
    # the compute-bound prompts are every fit's: a long prompt is predicted alike
    assert float(slow.predict(d, 16384, B)) == pytest.approx(float(mixed.predict(d, 16384, B)), rel=0.05)


def test_one_launch_level_is_not_split() -> None:
    events = _events(200, seed=5, noise=0.05)
    levels = launch_levels(events, GRID)
    assert not levels.split
    slow = fit_passive_model(events, GRID, bootstrap=5, launch_level="slow")
    mixed = fit_passive_model(events, GRID, bootstrap=5)
    assert slow is not None and mixed is not None and slow.events == mixed.events
    with pytest.raises(ValueError, match="launch level"):
        fit_passive_model(events, GRID, bootstrap=5, launch_level="medium")


# --- level-matched scoring ---------------------------------------------------------------------


def _rep(truth: ContextAwareModel, d: int, p: int, steps: bool = True) -> FitEvent:
    """One injected repetition of the cell (B, d, p) whose chunk step cost what `truth` says."""
    pi = truth.chunk_penalties_ms(d, np.asarray(chunk_schedule(p, B, d), np.float64))
    total = float(pi.sum() + truth.sigma0_ms + truth.sigma1_ms_per_token * p)
    return FitEvent(B, d, p, total, 6.0, tuple(float(x) for x in 6.0 + pi) if steps else (), source="injected")


# injected cells and the launch level their two repetitions ran at (launch-bound: one eager chunk of <= 2048)
AT = {(B, 6, 1024): ("fast", "fast"), (B, 8, 1024): ("slow", "slow"), (B, 12, 1024): ("fast", "fast"),
      (B, 8, 2048): ("slow", "fast"), (B, 12, 2048): ("slow", "slow")}
TRUTH = {"slow": SLOW, "fast": FAST}


def _injected_at_levels() -> tuple[dict[tuple[int, int, int], float], dict[tuple[int, int, int], list[FitEvent]]]:
    reps = {k: [_rep(TRUTH[lv], k[1], k[2]) for lv in at] for k, at in AT.items()}
    reps[(B, 8, 16384)] = [_rep(TRUE, 8, 16384)] * 2  # two chunks: not launch-bound
    table = {k: float(np.mean([r.decode * r.total_ms for r in v])) for k, v in reps.items()}
    return table, reps


def test_level_matched_scores_each_injected_cell_at_the_level_its_repetitions_ran_at() -> None:
    events = _two_level_events(300)
    table, reps = _injected_at_levels()
    # 5 refits per interval: the intervals are checked for their order and that a not launch-bound cell's
    # is the mixed fit's (refitted alike below); the estimates and errors do not depend on the refits
    matched = level_matched(events, GRID, table, reps, bootstrap=5)
    assert matched is not None and matched.levels.split
    by = {m.cell.key: m for m in matched.cells}
    for key, at in AT.items():
        m = by[key]
        assert (m.slow_reps, m.fast_reps, m.reps) == (at.count("slow"), at.count("fast"), 2)
        assert m.level == ("slow+fast" if len(set(at)) == 2 else at[0])
        assert 0 < m.read_events <= m.level_events
        assert m.cell.low_ms is not None and m.cell.high_ms is not None and m.cell.low_ms <= m.cell.high_ms
        assert abs(matched.errors.by_cell[key]) < 0.1, key  # each cell within 10 % of its own level
    # the one classifier: a repetition is read by the modes that split the events, as the events are
    assert [matched.levels.level_of(e) for e in events if e.prompt < 2000] == [
        "slow" if i % 2 == 0 else "fast" for i, e in enumerate(events) if e.prompt < 2000]
    # a two-chunk cell is not launch-bound: scored as the mixed fit has it, unchanged
    mixed = fit_passive_model(events, GRID, bootstrap=5)
    assert mixed is not None
    plain = {c.key: c for c in cells(mixed, events, GRID)}
    assert by[(B, 8, 16384)].level == "not launch-bound" and by[(B, 8, 16384)].cell == plain[(B, 8, 16384)]
    # the cell whose repetitions ran one at each level: the two level fits' estimates, half and half
    at = {lv: fit_passive_model(events, GRID, bootstrap=0, launch_level=lv) for lv in ("slow", "fast")}
    assert at["slow"] is not None and at["fast"] is not None
    half = (float(at["slow"].predict(8, 2048, B)) + float(at["fast"].predict(8, 2048, B))) / 2
    assert by[(B, 8, 2048)].cell.aggregate_ms == pytest.approx(half)


def test_scoring_that_ignores_the_repetitions_levels_misses_cells_the_matched_scoring_hits() -> None:
    """The injected reference read the fast level in some cells and the slow one in others: neither the
    mixed fit nor one level's fit is within 15 % everywhere; scored level-matched, every cell is.
    Point errors only, which the bootstrap does not move (the same figures with 20 refits: 11 s of CPU
    instead of 1); the level-matched intervals are the test above's."""
    events = _two_level_events(300)
    table, reps = _injected_at_levels()
    matched = level_matched(events, GRID, table, reps, bootstrap=0)
    assert matched is not None and matched.errors.mape is not None and matched.errors.worst is not None
    assert matched.errors.worst < 0.1
    for level in ("mixed", "slow", "fast"):
        fit = fit_passive_model(events, GRID, bootstrap=0, launch_level=level)
        assert fit is not None
        ignored = injected_errors(cells(fit, events, GRID), table)
        assert ignored.worst is not None and ignored.worst > 0.25, level
        assert ignored.mape is not None and ignored.mape > 2 * matched.errors.mape, level
    # every repetition read as the opposite level (matching swapped) misses as badly
    swapped = {k: [_rep(TRUTH["fast" if lv == "slow" else "slow"], k[1], k[2]) for lv in at] for k, at in AT.items()}
    wrong = level_matched(events, GRID, table, {**reps, **swapped}, bootstrap=0)
    assert wrong is not None and wrong.errors.worst is not None and wrong.errors.worst > 0.25


def test_level_matched_keeps_the_mixed_estimate_where_no_level_can_be_read() -> None:
    table, reps = _injected_at_levels()
    blind = {k: [_rep(TRUTH[lv], k[1], k[2], steps=False) for lv in at] for k, at in AT.items()}
    events = _two_level_events(300)
    unread = level_matched(events, GRID, table, {**reps, **blind}, bootstrap=5)
    assert unread is not None and {m.level for m in unread.cells if m.cell.key in AT} == {"unread"}
    one = _events(200, seed=5)
    single = level_matched(one, GRID, table, reps, bootstrap=5)
    mixed = fit_passive_model(one, GRID, bootstrap=5)
    assert single is not None and mixed is not None and not single.levels.split
    assert all(m.level in ("no two levels", "not launch-bound") and not m.matched for m in single.cells)
    assert single.errors == injected_errors(cells(mixed, one, GRID), table)  # the mixed figure, unchanged


def test_injected_reps_take_each_repetition_of_the_injected_records() -> None:
    from types import SimpleNamespace as NS

    def rep(steps: list[float] | None, total: float | None, at: str | None = None) -> NS:
        return NS(baseline=NS(tpot_p50_ms=10.0), interference=NS(chunk_step_times_ms=steps),
                  derived=NS(total_interference_ms=total), started_at=at)

    injected = NS(config=NS(mode="fast", chunk_size=B, decode_batch_size=12, new_prefill_tokens=512),
                  reps=[rep([78.1], 62.0, "2026-01-01T00:01:00+00:00"), rep(None, 60.0), rep([70.0], None)])
    passive = NS(config=NS(mode="passive", chunk_size=B, decode_batch_size=12, new_prefill_tokens=512),
                 reps=[rep([70.0], 50.0)])
    out = injected_reps([injected, passive])
    assert list(out) == [(B, 12, 512)]
    assert [(e.decode, e.prompt, e.total_ms, e.baseline_ms, e.chunk_steps_ms) for e in out[(B, 12, 512)]] == [
        (12, 512, 62.0, 10.0, (78.1,)), (12, 512, 60.0, 10.0, ())]
    # each repetition's start (epoch s), which block of a spread run it is; 0 where the record has none
    assert [e.at_s for e in out[(B, 12, 512)]] == [1767225660.0, 0.0]


def _joint_events(n: int, seed: int = 0) -> list[FitEvent]:
    """TRUE's events where every other one is k = 2-3 prefills run as one chunked stream of their summed
    tokens (8,000-30,000): the stream's chunk steps, each chunk's attention pairs its prompts' own."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        d = int(rng.integers(3, 14))
        k = 1 if i % 2 else int(rng.integers(2, 4))
        prompts = tuple(int(x) for x in np.exp(rng.uniform(np.log(8000 / k), np.log(30000 / k), k)))
        p = sum(prompts)
        chunks = np.asarray(chunk_schedule(p, B, d), np.float64)
        graph = np.array([TRUE.rule.graph_step(int(c), d) for c in chunks])
        pi = np.where(graph, TRUE.chunk_penalties_ms(d, chunks),
                      TRUE.eager_penalty_ms(d, chunks, stream_pairs(chunks, prompts)))
        pi = pi * rng.normal(1.0, 0.02, chunks.size)
        total = float(pi.sum() + TRUE.sigma0_ms + TRUE.sigma1_ms_per_token * p)
        out.append(FitEvent(B, d, p, total, 6.0, tuple(float(x) for x in 6.0 + pi), 1.5 * i, "otlp",
                            prefills=k, prompts=prompts if k > 1 else ()))
    return out


def test_stream_pairs_are_each_prompts_own() -> None:
    chunks = np.array([6000.0, 4000.0])
    assert np.allclose(stream_pairs(chunks), attention_pairs(chunks, [0.0, 6000.0]))  # one prompt of the sum
    own = stream_pairs(chunks, (3000, 7000))
    # chunk 1: prompt 1 whole, then 3,000 tokens of prompt 2 from its start; chunk 2: prompt 2's last 4,000
    assert own.tolist() == [3000 * 3001 / 2 + 3000 * 3001 / 2, 4000 * 3000 + 4000 * 4001 / 2]
    assert own.sum() == 3000 * 3001 / 2 + 7000 * 7001 / 2
    assert np.allclose(stream_pairs(chunks, (3000, 6000)), stream_pairs(chunks))  # not its prompts: one prompt


def test_a_joint_event_is_priced_by_its_own_prompts_pairs_not_one_prompt_of_the_sum() -> None:
    import dataclasses

    events = _joint_events(240)
    assert sum(e.own_prompts for e in events) == 120 and all(e.prompts == (e.prompt,) for e in events[1::2])
    data = event_fit_data(events)
    assert data.prompts is not None and data.prompts[0] == events[0].prompts
    model = fit_passive_model(events, GRID, bootstrap=0)
    assert model is not None
    assert model.model.beta_ms_per_token_pair == pytest.approx(TRUE.beta_ms_per_token_pair, rel=0.05)
    for d, p in ((6, 16384), (12, 32768)):  # a table cell is one prompt of P, its prediction the model's
        assert float(model.predict(d, p, B)) == pytest.approx(float(TRUE.predict(d, p, B)), rel=0.05)
    # its in-sample R^2 prices the joint events as the fit did: by their own pairs, not the summed P
    from pdexporter.analysis.models import r_squared

    as_summed = r_squared(data.cost_ms, model.model.predict(data.decode, data.prefill, data.chunk_size))
    assert model.in_sample_r2 is not None and as_summed is not None
    assert model.in_sample_r2 > 0.995 and 1 - model.in_sample_r2 < 0.5 * (1 - as_summed)
    # the same events priced as one prompt of their summed P (their prompts unknown): the pairs they do not
    # do pull the slope down, and the compute-bound cells read low
    summed = [dataclasses.replace(e, prompts=()) for e in events]
    assert not any(e.own_prompts for e in summed) and event_fit_data(summed).prompts is None
    old = fit_passive_model(summed, GRID, bootstrap=0)
    assert old is not None
    assert old.model.beta_ms_per_token_pair < 0.96 * TRUE.beta_ms_per_token_pair
    assert float(old.predict(12, 32768, B)) < 0.97 * float(TRUE.predict(12, 32768, B))


def test_joint_events_take_their_prompts_from_the_record_else_the_runs_requests() -> None:
    from types import SimpleNamespace as NS

    def rep(p: int, ids: list[str], sizes: list[int] | None = None) -> NS:
        info = {"decode_batch_size": 6, "prompt_tokens": p, "prefills": len(ids), "joint": True,
                "request_ids": ids, "source": "otlp"}
        if sizes is not None:
            info["prompt_sizes"] = sizes
        return NS(model_extra={"passive": info}, derived=NS(total_interference_ms=90.0),
                  baseline=NS(tpot_p50_ms=6.0), interference=NS(chunk_step_times_ms=[60.0, 40.0]),
                  started_at="2026-01-01T00:00:00+00:00")

    record = NS(config=NS(mode="passive", chunk_size=B), reps=[
        rep(12000, ["a", "b"], [5000, 7000]),  # the record's own sizes
        rep(9000, ["c", "d"]),  # written before them: from the requests
        rep(9100, ["c", "e"]),  # an id the requests do not hold: one prompt of the sum
        rep(9001, ["c", "d"], [4000, 5001]),
    ])
    requests = {"c": 4000, "d": 5000, "a": 1}
    events = events_from_records([record], requests)
    assert [e.prompts for e in events] == [(5000, 7000), (4000, 5000), (9100,), (4000, 5001)]
    assert [e.own_prompts for e in events] == [True, True, False, True]
    assert [e.prompts for e in events_from_records([record])] == [(5000, 7000), (9000,), (9100,), (4000, 5001)]
    assert joint_prompts({"prompt_tokens": 9000, "request_ids": ["c", "d"]}, {"c": 4000, "d": 4999}) == ()


def test_the_last_minutes_events_are_counted_at_each_level() -> None:
    """`recent_levels`: the launch-bound one-chunk events of the last `window_s` of traffic at each level (one event
    every 1.5 s: the last 300 s hold events 39-239), None where no two clear levels show."""
    events = _two_level_events(240)
    levels = launch_levels(events, GRID)
    recent = set(range(39, 240))  # at_s >= 358.5 - 300
    assert recent_levels(events, levels) == (len(levels.fast & recent), len(levels.slow & recent))
    fast, slow = recent_levels(events, levels, window_s=30.0) or (0, 0)  # events 219-239: 14 one-chunk ones
    assert (fast, slow) == (7, 7)
    one = _events(200, seed=5, noise=0.05)
    assert recent_levels(one, launch_levels(one, GRID)) is None
