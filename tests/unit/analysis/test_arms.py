"""Both arms in one table, the measured transfer with its regimes, the physical two-arm terms and
their replicates, the pair prediction (`analysis.arms`), on samples whose numbers are known by
construction."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from pdexporter.analysis.arms import (
    JOIN_COLUMNS,
    TERM_FEATURES,
    Rows,
    fit_term,
    fit_transfer,
    given_transfer,
    join_arms,
    predict_pair,
    two_arm_section,
    validation_summary,
)
from pdexporter.analysis.table import COLUMNS, SEED_COLUMNS, ConfigSamples, build_table

KEYS = [(8192, d, p) for d in (0, 1, 4, 8) for p in (2048, 8192, 32768)]
RULE = {"decodes_take_budget": True, "decodes_in_chunk_step": True, "graph_max_tokens": 512}
KV = 98304  # bytes per token (Qwen3-Coder-30B-A3B)


def samples(values: dict, keys=KEYS, reps: int = 3, arm: str = "colocated", noise: float = 0.0,
            slow: set | None = None) -> list[ConfigSamples]:
    """One ConfigSamples per key, `reps` repetitions of `values` (name -> fn(b, d, p, rep))."""
    rng = np.random.default_rng(0)
    out = []
    for b, d, p in keys:
        rows = []
        for r in range(reps):
            row = {name: fn(b, d, p, r) for name, fn in values.items()}
            if noise:
                row = {
                    k: (v * (1 + noise * rng.standard_normal()) if isinstance(v, float) else v) for k, v in row.items()
                }
            rows.append(row)
        out.append(ConfigSamples(b, d, p, tuple(rows), engine="vllm", arm=arm))
    return out


def colocated(**kw) -> list[ConfigSamples]:
    return samples({
        "prefill_duration_ms": lambda b, d, p, r: 50 + 0.03 * p + 2e-6 * p * p,
        "aggregate_interference_ms": lambda b, d, p, r: None if d == 0 else d * (40 + 0.03 * p),
        "total_interference_ms": lambda b, d, p, r: None if d == 0 else 40 + 0.03 * p,
        "tpot_interference_ms": lambda b, d, p, r: None if d == 0 else 50.0 + d,
        "tpot_penalty_ms": lambda b, d, p, r: None if d == 0 else 45.0,
        "tpot_baseline_ms": lambda b, d, p, r: None if d == 0 else 5.0,
    }, **kw)


def transfer_ms(p: int, slow: bool = False) -> float:
    return 4.0 + p * KV / (4e9 if slow else 250e9) * 1e3


def offloaded(pair: bool, slow_d: int | None = None) -> list[ConfigSamples]:
    """The offloaded arm; with `slow_d`, the pair's transfers at that D ran at 4 GB/s (a slow
    stretch) and stalled the decode instance's decodes for 90 % of it."""
    def slow(d: int) -> bool:
        return slow_d is not None and d == slow_d

    values = {
        "prefill_duration_ms": lambda b, d, p, r: 20 + 0.001 * p,
        "aggregate_interference_ms": lambda b, d, p, r: d * (2 + 0.0001 * p),
        "total_interference_ms": lambda b, d, p, r: 2 + 0.0001 * p + (0.9 * transfer_ms(p, True) if slow(d) else 0.0),
        "tpot_interference_ms": lambda b, d, p, r: 8.0 + d,
        "tpot_penalty_ms": lambda b, d, p, r: 2.0,
    }
    if pair:
        values.update(
            {
                "offload_prefill_ms": lambda b, d, p, r: 55 + 0.03 * p + 2e-6 * p * p,
                "offload_ttft_ms": lambda b, d, p, r: (
                    (55 + 0.03 * p + 2e-6 * p * p) + transfer_ms(p, slow(d)) + 25 + 0.0014 * p
                ),
                "offload_decode_ms": lambda b, d, p, r: transfer_ms(p, slow(d)) + 25 + 0.0014 * p,
                "kv_transfer_ms": lambda b, d, p, r: transfer_ms(p, slow(d)),
                "kv_bytes": lambda b, d, p, r: float(KV * p),
            }
        )
    return samples(values, [k for k in KEYS if k[1] >= 1], arm="offloaded")


def doc() -> dict:
    return {"chunk_rule": dict(RULE), "replicates": {"model": [{}] * 20}}


def test_join_keeps_the_colocated_table_first_and_appends_the_other_arm() -> None:
    col, off = build_table(colocated()), build_table(offloaded(pair=True))
    col = col.reindex(columns=list(dict.fromkeys([*COLUMNS, *col.columns])))
    joined = join_arms(col, off)
    assert list(joined.columns[: len(col.columns)]) == list(col.columns)
    assert list(joined.columns[: len(SEED_COLUMNS)]) == list(SEED_COLUMNS)
    assert list(joined.columns[len(col.columns):]) == list(JOIN_COLUMNS)
    pd.testing.assert_frame_equal(joined[list(col.columns)], col)
    row = joined[(joined.decode_batch_size == 4) & (joined.new_prefill_tokens == 8192)].iloc[0]
    assert row.offloaded_aggregate_interference_ms == pytest.approx(4 * (2 + 0.8192))
    assert row.kv_transfer_ms == pytest.approx(transfer_ms(8192), abs=1e-3)
    assert row.colocated_ttft_ms == pytest.approx(row.prefill_duration_ms)
    assert joined[joined.decode_batch_size == 0]["offloaded_aggregate_interference_ms"].isna().all()


def test_the_transfer_is_latency_plus_bytes_over_bandwidth() -> None:
    model = fit_transfer(offloaded(pair=True))
    assert model is not None and model.source == "measured" and model.degraded is None
    assert model.latency_ms == pytest.approx(4.0, abs=1e-6) and model.gb_per_s == pytest.approx(250.0, rel=1e-6)
    assert model.bytes_per_token == pytest.approx(KV)
    assert model(32768) == pytest.approx(transfer_ms(32768))
    assert fit_transfer(offloaded(pair=False)) is None  # DecodeBench: nothing transferred, nothing measured
    given = given_transfer(225.0, KV, 5.0)
    assert given.source == "given" and given(32768) == pytest.approx(5 + KV * 32768 / 225e9 * 1e3)


def test_a_slow_stretch_is_a_regime_of_its_own_not_part_of_the_bandwidth() -> None:
    """Most of a run's windows in a 4 GB/s stretch (as on the H200 pair): the nominal model is the
    fast windows', the stretch is reported with its share and its stall, and kept out of the terms."""
    off = offloaded(pair=True, slow_d=8)
    model = fit_transfer(off)
    assert model is not None and model.gb_per_s == pytest.approx(250.0, rel=1e-6)
    assert model.degraded is not None and model.degraded["gb_per_s"] == pytest.approx(4.0, rel=0.02)
    assert model.degraded["windows"] == 9 and model.degraded["share_of_windows"] == pytest.approx(1 / 3, abs=1e-3)
    assert model.degraded["stall_share"] == pytest.approx(0.9, abs=0.02)
    section = two_arm_section(colocated(), off, model, doc())
    assert section is not None
    loss = section["terms"]["offloaded_loss"]
    assert loss["range"]["decode_batch_size"] == [1, 4]  # the slow windows are not the nominal loss
    assert loss["coefficients"] == pytest.approx({"1": 2.0, "d": 0.0, "p": 0.1}, abs=1e-6)


def test_terms_recover_known_coefficients_and_never_go_negative() -> None:
    rng = np.random.default_rng(1)
    x = rng.uniform(0, 10, size=(60, 3))
    x[:, 0] = 1.0
    keys = [(8192, int(d), int(p)) for d, p in zip(rng.integers(1, 12, 60), rng.choice([512, 2048, 8192], 60))]
    term = fit_term("decode_side", Rows(x, x @ np.array([20.0, 1.5, 3.0]), keys), "test")
    assert term is not None
    assert term.to_dict()["coefficients"] == pytest.approx({"1": 20.0, "d": 1.5, "p": 3.0}, rel=1e-6)
    falling = fit_term("decode_side", Rows(x, 100.0 - 5.0 * x[:, 2], keys), "test")  # would need a negative slope
    assert falling is not None and min(falling.to_dict()["coefficients"].values()) >= 0.0
    assert fit_term("decode_side", Rows(np.empty((0, 3)), np.empty(0), []), "test") is None


def test_the_offloaded_loss_is_fitted_on_relative_residuals() -> None:
    """Most admissions cost each decode ~5 ms, the longest prompts ~20 ms: the offloaded loss is
    fitted on relative residuals (each row weighed by 1 / its value), the other terms on absolute ones."""
    ps = [512, 1024, 2048, 4096, 8192, 32768] * 5
    x = np.array([[1.0, 4.0, p / 1000.0] for p in ps])
    keys = [(8192, 4, p) for p in ps]
    exact = fit_term("offloaded_loss", Rows(x, x @ np.array([5.0, 0.0, 0.45]), keys), "test")
    assert exact is not None and exact.relative
    assert exact.to_dict()["coefficients"] == pytest.approx({"1": 5.0, "d": 0.0, "p": 0.45}, abs=1e-6)
    assert "relative residuals" in exact.to_dict()["fit"]
    side = fit_term("decode_side", Rows(x, x @ np.array([5.0, 0.0, 0.45]), keys), "test")
    assert side is not None and not side.relative and "relative" not in side.to_dict()["fit"]
    # the weights a replicate refits with are the relative ones: rows of larger values weigh less
    assert exact.weights[ps.index(32768)] < exact.weights[ps.index(512)] / 10
    assert exact.replicate(sorted(set(keys))) == pytest.approx({"1": 5.0, "d": 0.0, "p": 0.45}, abs=1e-6)


def test_two_arm_section_uses_the_pairs_measurements_or_composes_from_decode_bench() -> None:
    col = colocated()
    d = doc()
    pair = two_arm_section(col, offloaded(pair=True), fit_transfer(offloaded(pair=True)), d)
    assert pair is not None and pair["offloaded_setup"] == "1P1D pair" and pair["measured_chunk_sizes"] == [8192]
    terms = pair["terms"]
    assert set(terms) == {
        "colocated_ttft",
        "offloaded_loss",
        "offloaded_tpot",
        "decode_side",
        "prefill_offset",
        "transfer",
    }
    assert terms["transfer"]["source"] == "measured"
    # the decode side is the routed TTFT less the prefill instance and the transfer: 25 + 1.4 per 1K tokens
    assert terms["decode_side"]["coefficients"] == pytest.approx({"1": 25.0, "d": 0.0, "p": 1.4}, abs=1e-6)
    assert all(set(t["range"]) >= {"decode_batch_size", "new_prefill_tokens", "chunk_sizes"}
               for name, t in terms.items() if name != "transfer")
    assert len(d["replicates"]["two_arm"]) == 20 and set(d["replicates"]["two_arm"][0]) >= {"decode_side", "transfer"}
    bench = two_arm_section(col, offloaded(pair=False), None, doc())
    assert bench is not None and bench["offloaded_setup"].startswith("DecodeBenchConnector")
    assert "prefill_offset" not in bench["terms"] and bench["terms"]["transfer"] == {"source": "seed-constant"}
    assert bench["terms"]["decode_side"]["coefficients"] == pytest.approx({"1": 20.0, "d": 0.0, "p": 1.0}, abs=1e-6)
    assert TERM_FEATURES["offloaded_loss"][0] == tuple(bench["terms"]["offloaded_loss"]["features"])


def test_predicting_the_pair_from_one_gpu_and_comparing() -> None:
    col_s, pair_s = colocated(), offloaded(pair=True)
    col, pair, bench = build_table(col_s), build_table(pair_s), build_table(offloaded(pair=False))
    frame = predict_pair(col, bench, pair, fit_transfer(pair_s))
    assert len(frame) == len(pair)
    # the DecodeBench arm's aggregate equals the pair's by construction: the saving is predicted exactly
    assert frame["saved_error_pct"].abs().max() == pytest.approx(0.0, abs=1e-6)
    summary = validation_summary(frame)
    assert summary["points_compared"] == 9 and summary["saved_within_goal"] == 9
    off = pair.copy()
    off["aggregate_interference_ms"] *= 3  # the pair's decodes lose 3x what DecodeBench's did
    worse = predict_pair(col, bench, off, fit_transfer(pair_s))
    assert (worse["saved_error_pct"] > 0).all()  # the prediction overstates the saving, and says by how much


def test_a_threshold_rising_with_d_is_flagged_only_beyond_both_intervals() -> None:
    from pdexporter.analysis.thresholds import Budget, Threshold, ThresholdSet

    def entry(d: int, t: int, lo: int, hi: int) -> Threshold:
        return Threshold(8192, d, t, lo, hi, True, "decided", False, None, (), None, False)

    def rising(*records: Threshold) -> list[str]:
        return ThresholdSet("two-arm", "nominal", Budget("given", 50.0, None, "nominal"), None, None, 131072, 64,
                            3, None, records, False).rising()

    assert rising(entry(8, 192, 128, 256), entry(9, 256, 128, 256)) == []  # inside D=8's interval: noise
    assert rising(entry(7, 5376, 5000, 5600), entry(12, 12480, 12000, 13000)) == ["B=8192: D=7 5376 -> D=12 12480"]


def test_pooling_refuses_measurements_of_different_setups(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from dataclasses import replace

    from pdexporter.analysis import job
    from pdexporter.errors import RecordError

    base = ConfigSamples(8192, 4, 512, reps=({"tpot_penalty_ms": 40.0},), engine="vllm", gpu="H200", model="m")
    other = replace(base, reps=({"tpot_penalty_ms": 36.0},))
    for d in ("a", "b", "c"):
        (tmp_path / d).mkdir()
    loads = {
        str(tmp_path / "a"): [base],
        str(tmp_path / "b"): [other],
        str(tmp_path / "c"): [replace(other, gpu="H100")],
    }
    monkeypatch.setattr(job, "load_results", lambda directory, tick=None: loads[str(directory)])
    pooled = job.load_joined([tmp_path / "a", tmp_path / "b"], pool=True)
    assert len(pooled) == 1 and [r["tpot_penalty_ms"] for r in pooled[0].reps] == [40.0, 36.0]
    with pytest.raises(RecordError, match=r"B=8192 D=4 P=512: gpu 'H200' in .*a but 'H100' in .*c"):
        job.load_joined([tmp_path / "a", tmp_path / "c"], pool=True)
    with pytest.raises(RecordError, match="is in both"):
        job.load_joined([tmp_path / "a", tmp_path / "b"])
