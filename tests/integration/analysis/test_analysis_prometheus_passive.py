"""`export-table --prometheus URL --mode passive` against a real Prometheus: passive windows
(production prefills, `mode="passive"`, binned labels) published through the exporter's own
metrics and exposition, several per scrape for one cell (their values overwritten, the counter
still counting them), and active windows beside them that a passive table must leave out."""

from __future__ import annotations

import subprocess
import time

import pandas as pd
import pytest

from pdexporter.exporter.metrics import grid_labels, publish_window
from pdexporter.measure.records import RepRecord
from tests.helpers import run_cli

pytestmark = pytest.mark.integration


def _rep(penalty: float, d: int) -> RepRecord:
    base = 6.0
    return RepRecord.model_validate(
        {
            "rep": 0,
            "baseline": {"tpot_p50_ms": base, "tpot_p90_ms": 7.0, "tpot_p99_ms": 8.0, "step_time_ms": base},
            "interference": {
                "tpot_during_prefill_p50_ms": base + penalty,
                "tpot_during_prefill_p90_ms": base + penalty,
                "tpot_during_prefill_mean_ms": base + penalty,
                "tpot_after_prefill_p50_ms": base,
                "num_chunks_actual": 1,
                "num_chunks_expected": 1,
                "prefill_duration_ms": penalty + base,
                "prefill_ttft_ms": penalty + base,
            },
            "derived": {
                "tpot_penalty_ms": penalty,
                "tpot_penalty_p50_ms": penalty,
                "tpot_penalty_ratio": penalty / base,
                "total_interference_ms": penalty,
                "decode_tokens_delayed": d,
                "aggregate_interference_ms": penalty * d,
            },
        }
    )


def _run(capsys: pytest.CaptureFixture[str], *args: str) -> subprocess.CompletedProcess[str]:
    """`pdexporter ARGS` in this process (`cli.main`, what `python -m pdexporter` calls): its exit
    code, stdout and stderr, without a process's start-up (a second or more of CPU each)."""
    code, out, err = run_cli(capsys, *args)
    return subprocess.CompletedProcess(["pdexporter", *args], code, out, err)


def test_passive_table_from_prometheus(exporter_double, prometheus_for, tmp_path, capsys) -> None:
    m = exporter_double.metrics
    m.engine_info.labels(engine="pdexporter-sim", model="stand-in", chunk_size="8192", chunk_size_source="given",
                         modelled="true").set(1)
    prom = prometheus_for([exporter_double.target])
    start = time.time() - 1.0
    cell = grid_labels(8192, 4, 2048, mode="passive", engine="vllm")
    few = grid_labels(8192, 3, 16384, mode="passive", engine="vllm")  # D = 3 joins the seed grid's D = 4 under --grid
    outside = grid_labels(8192, 4, 128, mode="passive", engine="vllm")  # below the seed grid's smallest P bin
    penalties = [46.0, 48.0, 47.0, 49.0, 48.5, 47.5]
    for k, penalty in enumerate(penalties):
        publish_window(m, cell, _rep(penalty, 4))
        if k == 2:
            publish_window(m, cell, _rep(47.2, 4))  # two in one scrape: the first one's values are lost
            publish_window(m, few, _rep(150.0, 3))
            publish_window(m, outside, _rep(4.0, 4))
            publish_window(
                m, grid_labels(8192, 4, 2048, engine="vllm"), _rep(10.0, 4)
            )  # an injected window: not passive
        prom.wait_for("pdexporter_windows_total", lambda result, k=k: any(
            r["metric"].get("mode") == "passive" and r["metric"]["new_prefill_tokens"] == "2048"
            and float(r["value"][1]) == k + 1 + (k >= 2) for r in result))
        time.sleep(1.2)

    out = tmp_path / "passive"
    done = _run(capsys, "export-table", "--prometheus", prom.url, "--from", f"{start:.3f}", "--to", "now",
                "--mode", "passive", "--min-events", "5", "--out", str(out), "--no-plots")
    assert done.returncode == 0, done.stderr
    table = pd.read_csv(out / "interference_table.csv").set_index(["decode_batch_size", "new_prefill_tokens"])
    assert sorted(table.index) == [(3, 16384), (4, 128), (4, 2048)]
    row = table.loc[(4, 2048)]
    assert row["events"] == 7 and row["reps"] == 6  # 7 windows counted, 6 with values
    assert not row["too_few_events"] and table.loc[(3, 16384), "too_few_events"]
    assert row["tpot_penalty_ms"] == pytest.approx(
        sorted(penalties)[2:4][0] / 2 + sorted(penalties)[2:4][1] / 2, rel=1e-3
    )
    assert row["tpot_penalty_ms_ci95_low"] <= row["tpot_penalty_ms"] <= row["tpot_penalty_ms_ci95_high"]
    assert "passive: 9 events in 3 cells, 2 with fewer than 5 events" in " ".join(done.stderr.split()), done.stderr

    seeded = tmp_path / "seed"
    done = _run(capsys, "export-table", "--prometheus", prom.url, "--from", f"{start:.3f}", "--to", "now",
                "--mode", "passive", "--grid", "sweeps/seed.yaml", "--out", str(seeded), "--no-plots")
    assert done.returncode == 0, done.stderr
    table = pd.read_csv(seeded / "interference_table.csv").set_index(["decode_batch_size", "new_prefill_tokens"])
    assert sorted(table.index) == [(4, 2048), (4, 16384)]
    assert "1 passive cells (1 events) lie outside every bin" in " ".join(done.stderr.split())

    active = _run(capsys, "export-table", "--prometheus", prom.url, "--from", f"{start:.3f}", "--to", "now",
                  "--out", str(tmp_path / "active"), "--no-plots")
    assert active.returncode == 0, active.stderr
    assert pd.read_csv(tmp_path / "active" / "interference_table.csv")["tpot_penalty_ms"].tolist() == [10.0]
