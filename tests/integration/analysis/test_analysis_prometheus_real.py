"""`export-table --prometheus` against a real Prometheus that scraped exporter-shaped metrics.

The scraped endpoint is a test double of the exporter (`ExporterDouble`: the exporter's own
metrics, `publish_window` and aiohttp exposition, fed one window per repetition of records instead
of live probe streams). The records are measured on the embedded engine (SimDriver, virtual
time). The end-to-end test with the real `pdexporter run` exporter belongs with its merge.
"""

from __future__ import annotations

import socket
import subprocess
import time

import pandas as pd
import pytest

from pdexporter.analysis.table import KEY_COLUMNS, build_table, samples_from_record
from pdexporter.exporter.metrics import set_engine_info
from tests.helpers import run_cli

pytestmark = pytest.mark.integration

POINTS = [(8192, 4, 8192), (8192, 4, 32768), (2048, 1, 4096)]
REPS = 3


def _run(capsys: pytest.CaptureFixture[str], *args: str) -> subprocess.CompletedProcess[str]:
    """`pdexporter ARGS` in this process (`cli.main`, what `python -m pdexporter` calls): its exit
    code, stdout and stderr, without a process's start-up (a second or more of CPU each)."""
    code, out, err = run_cli(capsys, *args)
    return subprocess.CompletedProcess(["pdexporter", *args], code, out, err)


def test_export_table_from_prometheus_gives_the_records_penalties(exporter_double, prometheus_for, tmp_path,
                                                                  make_sim_records, capsys):
    records = make_sim_records(POINTS, reps=REPS, out=tmp_path / "records")
    for r in records:
        set_engine_info(exporter_double.metrics, r.config.engine, r.config.model, r.config.chunk_size, True)
    prom = prometheus_for([exporter_double.target])
    start = time.time() - 1.0
    for k in range(REPS):
        for record in records:
            exporter_double.publish(record, record.reps[k])
        # Wait until Prometheus has scraped this round, then one more scrape so every 1 s step sees it.
        prom.wait_for(
            "pdexporter_windows_total",
            lambda result, k=k: len(result) == len(POINTS) and all(float(r["value"][1]) == k + 1 for r in result),
        )
        time.sleep(1.2)

    out = tmp_path / "out"
    done = _run(capsys, "export-table", "--prometheus", prom.url, "--from", f"{start:.3f}", "--to", "now",
                "--out", str(out), "--no-plots")
    assert done.returncode == 0, done.stderr
    got = pd.read_csv(out / "interference_table.csv").set_index(list(KEY_COLUMNS))
    want = build_table([samples_from_record(r) for r in records]).set_index(list(KEY_COLUMNS))
    assert sorted(got.index) == sorted(want.index)
    for key in want.index:
        assert got.loc[key, "reps"] == REPS, key  # every window found, none twice
        for column in ("tpot_penalty_ms", "penalty_ratio", "tpot_baseline_ms", "prefill_duration_ms",
                       "aggregate_interference_ms"):
            assert got.loc[key, column] == pytest.approx(want.loc[key, column], rel=0.05), (key, column)
        assert got.loc[key, "num_chunks"] == want.loc[key, "num_chunks"]
    assert got["modelled"].all() and (got["engine"] == "pdexporter-sim").all()
    assert (out / "fits.json").exists() and (out / "criteria.json").exists()

    # A range with no windows (before this Prometheus existed) is a one-line error.
    empty = _run(capsys, "export-table", "--prometheus", prom.url, "--from", "2001-01-01T00:00:00Z",
                 "--to", "2001-01-01T01:00:00Z", "--out", str(tmp_path / "empty"))
    assert empty.returncode != 0
    lines = empty.stderr.strip().splitlines()
    assert len(lines) == 1 and "no new pdexporter_windows_total" in lines[0], empty.stderr


def test_a_failed_scrape_adds_no_window(exporter_double, prometheus_for, tmp_path, make_sim_records, capsys):
    """A scrape that fails (the exporter's /metrics answers 503 for a few seconds: a timeout on a loaded exporter
    does the same) makes Prometheus mark every series stale; when scrapes succeed again each series is back with its
    old count. That is no window: two windows published around the outage are two repetitions, not three (before
    `increments_query` read the last sample before a step, the return counted as a series born with one window,
    the first window's values again: the suite saw it beside a CPU burner)."""
    (record,) = make_sim_records(POINTS[:1], reps=2, out=tmp_path / "records")
    set_engine_info(exporter_double.metrics, record.config.engine, record.config.model, record.config.chunk_size, True)
    prom = prometheus_for([exporter_double.target])
    start = time.time() - 1.0

    def up(value: float) -> None:
        prom.wait_for('up{job="pdexporter"}', lambda r: bool(r) and float(r[0]["value"][1]) == value)

    for k in range(2):
        exporter_double.publish(record, record.reps[k])
        prom.wait_for("pdexporter_windows_total", lambda r, k=k: bool(r) and float(r[0]["value"][1]) == k + 1)
        time.sleep(1.2)
        if k == 0:  # the outage, between the two windows
            exporter_double.failing.set()
            up(0.0)
            time.sleep(1.2)
            exporter_double.failing.clear()
            up(1.0)
            time.sleep(2.2)  # a step or two with the series back: where the old query saw it born again

    out = tmp_path / "out"
    done = _run(capsys, "export-table", "--prometheus", prom.url, "--from", f"{start:.3f}", "--to", "now",
                "--out", str(out), "--no-plots")
    assert done.returncode == 0, done.stderr
    assert "2 active windows rebuilt from Prometheus" in " ".join(done.stderr.split()), done.stderr
    got = pd.read_csv(out / "interference_table.csv")
    assert got["reps"].tolist() == [2]


def test_unreachable_prometheus_and_bad_times_are_one_line(tmp_path, capsys):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again when we leave: nothing listens there
    done = _run(capsys, "export-table", "--prometheus", f"http://127.0.0.1:{port}", "--from", "-5m",
                "--out", str(tmp_path))
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 3 and len(lines) == 1, done.stderr
    assert f"cannot reach Prometheus at http://127.0.0.1:{port}" in lines[0]
    bad = _run(capsys, "export-table", "--prometheus", f"http://127.0.0.1:{port}", "--from", "last tuesday")
    lines = bad.stderr.strip().splitlines()
    assert bad.returncode == 2 and len(lines) == 1 and "--from 'last tuesday'" in lines[0], bad.stderr
    assert not any(tmp_path.iterdir())  # nothing written
