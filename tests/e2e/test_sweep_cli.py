"""`pdexporter sweep` and `pdexporter sim sweep` end to end, as a user runs them.

A sweep killed with SIGKILL and resumed runs the real process. The other commands run
`pdexporter.cli.main` in this process (`here`: what `python -m pdexporter` calls, from the
repository root, on 120 columns as `pdexporter` gives them), a second of CPU less each: their exit
code, stdout, stderr and files are the same."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pdexporter.measure.store import ResultsStore, load_record_file
from pdexporter.sweep.spec import load_sweep
from tests.helpers import cli_here

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]


def pdexporter(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "pdexporter", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, "COLUMNS": "120"})


@pytest.fixture
def here(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch):  # type: ignore[no-untyped-def]
    """`pdexporter ARGS` in this process (`cli.main`), as `pdexporter` runs it: from the repository
    root, on 120 columns; its exit code, stdout and stderr as a finished process's."""
    return cli_here(capsys, monkeypatch, columns=120, cwd=ROOT)


def record_set(root: Path) -> dict[tuple[int, int, int], list[int]]:
    return {r.key: [x.rep for x in r.reps] for r in ResultsStore(root).iter_records()}


def test_quick_sweep_produces_the_seed_layout(tmp_path: Path, here) -> None:
    out = tmp_path / "results"
    run = here("sweep", "sweeps/quick.yaml", "--out", str(out))
    assert run.returncode == 0, run.stderr
    assert "MODELLED" in run.stderr and "sweep complete" in run.stderr
    spec = load_sweep(ROOT / "sweeps" / "quick.yaml")
    for chunk, d, p in spec.points():
        record = load_record_file(out / str(chunk) / f"D{d}_P{p}.json")  # results/{chunk}/D{d}_P{p}.json
        assert record.key == (chunk, d, p) and record.config.modelled and record.config.note
        assert set(record.model_dump()) >= {"config", "baseline", "interference", "derived"}
        assert len(record.reps) == spec.reps
        for rep in record.reps:
            assert (out / str(chunk) / rep.raw).is_file() and rep.raw.startswith("raw/")
        if d > 0:
            assert (out / str(chunk) / "raw" / f"D{d}_baseline.json.gz").is_file()
            assert record.derived.tpot_penalty_p50_ms is not None and record.derived.tpot_penalty_p50_ms > 0
    state = json.loads((out / "sweep.json").read_text())
    assert state["invocations"][-1]["status"] == "complete"
    # A rerun finds everything complete and rewrites nothing.
    before = {p: p.stat().st_mtime_ns for p in out.rglob("D*_P*.json")}
    again = here("sweep", "sweeps/quick.yaml", "--out", str(out), "--listen", "127.0.0.1:0")
    assert again.returncode == 0 and "8/8 configs" in again.stderr
    assert "exporting window gauges on http://127.0.0.1:" in again.stderr
    assert {p: p.stat().st_mtime_ns for p in out.rglob("D*_P*.json")} == before


def test_sim_sweep_predicts_in_the_same_format(tmp_path: Path, here) -> None:
    out = tmp_path / "predicted"
    run = here("sim", "sweep", "sweeps/quick.yaml", "--profile", "h200-qwen3-coder-30b-a3b", "--out", str(out),
                     "--mode", "fast")
    assert run.returncode == 0, run.stderr
    records = list(ResultsStore(out).iter_records())
    assert len(records) == 8 and all(r.config.mode == "fast" and r.config.modelled for r in records)
    assert all(r.config.profile == "h200-qwen3-coder-30b-a3b" for r in records)


def test_cooldown_option_overrides_the_file(tmp_path: Path, here) -> None:
    """quick.yaml is faithful with the seed's 5 s cooldown; --cooldown 0 is the ablation run on the GPU."""
    runs = {}
    for cooldown in ("0", "1.5"):
        out = tmp_path / cooldown
        run = here("sweep", "sweeps/quick.yaml", "--out", str(out), "--cooldown", cooldown)
        assert run.returncode == 0, run.stderr
        runs[cooldown] = json.loads((out / "sweep.json").read_text())
    assert runs["0"]["spec"]["cooldown"]["seconds"] == 0
    assert all(c["engine_s"]["cooldown"] == 0 for c in runs["0"]["invocations"][-1]["chunks"].values())
    reps_run = sum(c["reps_run"] for c in runs["1.5"]["invocations"][-1]["chunks"].values())
    modelled = sum(c["engine_s"]["cooldown"] for c in runs["1.5"]["invocations"][-1]["chunks"].values())
    assert modelled == pytest.approx(1.5 * reps_run, rel=0.05)
    bad = here("sweep", "sweeps/quick.yaml", "--out", str(tmp_path / "bad"), "--cooldown", "-1")
    assert bad.returncode == 2 and "--cooldown" in bad.stderr


def test_a_bad_sweep_file_is_one_line(tmp_path: Path, here) -> None:
    bad = tmp_path / "x.yaml"
    bad.write_text("grid:\n  chunk_sizes: [8192]\n  decode_batch_sizes: [0, 4, -1]\n  new_prefill_tokens: [512]\n")
    run = here("sweep", str(bad))
    assert run.returncode == 2
    assert run.stderr.strip() == f"pdexporter: error: {bad}: grid.decode_batch_sizes[2]: must be >= 0 (got -1)"


def test_deadline_stops_cleanly_with_exit_5(tmp_path: Path, here) -> None:
    run = here("sweep", "sweeps/quick.yaml", "--out", str(tmp_path / "r"), "--deadline", "1")
    assert run.returncode == 5, run.stderr
    assert "Rerun the same command to continue" in " ".join(run.stderr.split())


KILL_SWEEP = """
name: killable
grid:
  chunk_sizes: [2048, 8192]
  decode_batch_sizes: [0, 4]
  new_prefill_tokens: [512, 4096, 16384]
reps: 3
mode: fast
launcher: {kind: sim, profile: h200-qwen3-coder-30b-a3b, clock: virtual}
"""


def test_a_killed_sweep_resumes_to_the_same_records(tmp_path: Path) -> None:
    """SIGKILL mid-way (the GPU machine's time limit), rerun: the same records as one clean run.
    (Faithful mode's resume is covered in tests/unit/sweep/test_controller.py.)"""
    spec_file = tmp_path / "killable.yaml"
    spec_file.write_text(KILL_SWEEP)
    whole, cut = tmp_path / "whole", tmp_path / "cut"
    assert pdexporter("sweep", str(spec_file), "--out", str(whole)).returncode == 0

    proc = subprocess.Popen([sys.executable, "-m", "pdexporter", "sweep", str(spec_file), "--out", str(cut)],
                            cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and proc.poll() is None:
        if len(list(cut.glob("*/D*_P*.json"))) >= 5:
            break
        time.sleep(0.005)
    assert proc.poll() is None, "the sweep finished before it could be killed"
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    partial = record_set(cut)
    assert 0 < len(partial) < 12 and partial != record_set(whole)

    rerun = pdexporter("sweep", str(spec_file), "--out", str(cut))
    assert rerun.returncode == 0, rerun.stderr
    assert record_set(cut) == record_set(whole)
    for key in record_set(whole):
        a = ResultsStore(whole).load_record(*key)
        b = ResultsStore(cut).load_record(*key)
        assert b.interference.prefill_duration_ms == pytest.approx(a.interference.prefill_duration_ms, rel=0.05)
        if key[1]:
            assert b.derived.tpot_penalty_p50_ms == pytest.approx(a.derived.tpot_penalty_p50_ms, rel=0.05)


def test_chunk_index_runs_one_chunk_size_and_export_table_joins_them(tmp_path: Path, here) -> None:
    """The Kubernetes Indexed Job's command: pod I runs `--chunk-index I` into its own directory;
    `export-table DIR0 DIR1` joins them into one table (a grid point in two is refused)."""
    dirs = []
    for index, chunk in enumerate((2048, 8192)):  # quick.yaml's chunk sizes, in file order
        out = tmp_path / f"chunk-{index}"
        run = here("sweep", "sweeps/quick.yaml", "--chunk-index", str(index), "--out", str(out))
        assert run.returncode == 0, run.stderr
        assert sorted(p.name for p in out.iterdir() if p.is_dir()) == [str(chunk)]
        assert {r.key[0] for r in ResultsStore(out).iter_records()} == {chunk}
        dirs.append(out)
    bad = here("sweep", "sweeps/quick.yaml", "--chunk-index", "2", "--out", str(tmp_path / "x"))
    assert bad.returncode == 2
    assert bad.stderr.strip() == ("pdexporter: error: --chunk-index 2: out of range, sweeps/quick.yaml lists 2 "
                                  "chunk size(s) (indices 0..1)")

    joined = here("export-table", *map(str, dirs), "--no-plots")
    assert joined.returncode == 0, joined.stderr
    table = tmp_path / "interference_table.csv"  # default: the directories' common parent
    assert joined.stdout.strip() == str(table)
    import pandas as pd

    frame = pd.read_csv(table)
    assert len(frame) == 8 and sorted(set(frame["chunk_size"])) == [2048, 8192]
    assert list(frame.columns[-6:]) == ["tpot_penalty_ms_ci95_low", "tpot_penalty_ms_ci95_high",
                                        "prefill_duration_ms_ci95_low", "prefill_duration_ms_ci95_high",
                                        "aggregate_interference_ms_ci95_low", "aggregate_interference_ms_ci95_high"]

    twice = here("export-table", str(dirs[0]), str(dirs[1]), str(dirs[0]), "--no-plots")
    lines = [line for line in twice.stderr.splitlines() if line.strip()]
    assert twice.returncode != 0 and len(lines) == 1, twice.stderr
    assert lines[0] == (f"pdexporter: error: B=2048 D=0 P=512 is in both {dirs[0]} and {dirs[0]}: join results "
                        "directories of different grid points (or pool them)")

    # --pool: a grid point measured in two sessions keeps both sessions' repetitions
    from pdexporter.analysis.job import load_joined

    single = {s.key: len(s.reps) for s in load_joined([dirs[0]])}
    pooled = {s.key: s for s in load_joined([dirs[0], dirs[1], dirs[0]], pool=True)}
    assert {k: len(s.reps) for k, s in pooled.items() if k[0] == 2048} == {k: 2 * n for k, n in single.items()}
    assert all(s.top_level is None for k, s in pooled.items() if k[0] == 2048)
    pooled_run = here("export-table", str(dirs[0]), str(dirs[1]), str(dirs[0]), "--pool", "--no-plots",
                            "--out", str(tmp_path / "pooled"))
    assert pooled_run.returncode == 0, pooled_run.stderr
    assert len(pd.read_csv(tmp_path / "pooled" / "interference_table.csv")) == 8
