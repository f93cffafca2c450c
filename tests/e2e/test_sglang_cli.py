"""SGLang through every command a vLLM user has, end to end on the embedded engine imitating SGLang
(`--engine sglang[-mixed]`, `launcher.engine`): measure, run, sweep (the H200 sweep files predicted
by `sim sweep`), export-table, decide, and the GPU script's dry run. Numbers are modelled; what is checked
is the seam: the engine named in every record, row and series, its step log read as SGLang's, its
chunk schedule in both modes.

`measure`, `run` and the GPU script run as processes; the commands that predict, tabulate and
decide run `pdexporter.cli.main` in this process (`here`: what `python -m pdexporter` calls, from
the repository root, on 200 columns as `cli` gives them), a second of CPU less each."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
import tarfile
import time
import urllib.request
from pathlib import Path

import pytest

from tests.helpers import cli_here, free_port

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "200"}


def cli(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pdexporter", *args],
        check=False,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=ENV,
    )


@pytest.fixture
def here(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch):  # type: ignore[no-untyped-def]
    """`pdexporter ARGS` in this process (`cli.main`), as `cli` runs it: from the repository root, on
    200 columns; its exit code, stdout and stderr as a finished process's."""
    return cli_here(capsys, monkeypatch, columns=200, cwd=ROOT)


def test_measure_on_sglang_default_mode(tmp_path: Path) -> None:
    done = cli(
        "measure",
        "--engine",
        "sglang",
        "-B",
        "2048",
        "-D",
        "2",
        "-P",
        "3000",
        "--reps",
        "2",
        "--out",
        str(tmp_path),
    )
    assert done.returncode == 0, done.stderr
    record = json.loads((tmp_path / "2048" / "D2_P3000.json").read_text())
    config, i = record["config"], record["reps"][-1]["interference"]
    assert config["engine"] == "pdexporter-sim-sglang" and config["modelled"] is True
    assert (
        "--chunked-prefill-size" in config["engine_command"]
        and "--decode-log-interval" in config["engine_command"]
    )
    # SGLang's log: two chunk steps of B and the rest; the decodes paused through both: one stall
    assert i["chunk_tokens_engine_log"] == [2048, 952] and i["num_chunks_source"] == "engine-log"
    assert i["num_chunks_actual"] == i["num_chunks_expected"] == 1 and len(i["chunk_step_times_ms"]) == 1
    assert record["derived"]["tpot_penalty_p50_ms"] > 0


def test_unknown_engine_is_one_line(here) -> None:
    done = here("measure", "--engine", "sglung", "--out", "/nonexistent")
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert (
        done.stderr.strip()
        .splitlines()[-1]
        .startswith(
            "pdexporter: error: --engine 'sglung': the embedded engine imitates vllm, sglang, sglang-mixed"
        )
    )


def test_run_on_sglang_mixed_exports_its_engine_label(tmp_path: Path) -> None:
    port = free_port()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "pdexporter",
            "run",
            "--engine",
            "sglang-mixed",
            "--decode-batch-size",
            "2",
            "--chunk-size",
            "2048",
            "--new-prefill-tokens",
            "3000",
            "--inject-every",
            "500ms",
            "--decode-output-tokens",
            "96",
            "--listen",
            f"127.0.0.1:{port}",
            "--out",
            str(tmp_path),
            "--duration",
            "60s",
        ],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env=ENV,
    )
    try:
        seen = ""
        deadline = time.monotonic() + 60
        while "pdexporter_window_tpot_penalty_seconds{" not in seen and time.monotonic() < deadline:
            time.sleep(0.5)
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
                    seen = resp.read().decode()
            except OSError:
                assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
        windows = [
            line for line in seen.splitlines() if line.startswith("pdexporter_window_tpot_penalty_seconds{")
        ]
        assert windows and all('engine="pdexporter-sim-sglang-mixed"' in line for line in windows), seen[
            -2000:
        ]
        assert (
            'pdexporter_engine_info{chunk_size="2048",chunk_size_source="given",engine="pdexporter-sim-sglang-mixed"'
            in seen
        )
    finally:
        proc.terminate()
        proc.wait(timeout=60)
    record = json.loads((tmp_path / "2048" / "D2_P3000.json").read_text())
    assert record["config"]["engine"] == "pdexporter-sim-sglang-mixed"
    assert record["reps"][0]["interference"]["chunk_tokens_engine_log"] == [
        2046,
        954,
    ]  # B - D: the decodes joined


def test_sweep_files_predicted_then_tabulated_one_engine_at_a_time(tmp_path: Path, here) -> None:
    """`sim sweep` of the GPU sweep files imitates SGLang in the mode their command sets; a table is
    one engine's: two engines' records together need --engine."""
    out = {}
    for name in ("h200-sglang", "h200-sglang-mixed"):
        out[name] = tmp_path / name
        done = here("sim", "sweep", f"sweeps/{name}.yaml", "--out", str(out[name]), "--reps", "1")
        assert done.returncode == 0, done.stderr
    default = json.loads((out["h200-sglang"] / "8192" / "D4_P32768.json").read_text())
    mixed = json.loads((out["h200-sglang-mixed"] / "8192" / "D4_P32768.json").read_text())
    assert (
        default["config"]["engine"] == "pdexporter-sim-sglang"
        and mixed["config"]["engine"] == "pdexporter-sim-sglang-mixed"
    )
    assert default["reps"][0]["interference"]["chunk_tokens_engine_log"] == [8192] * 4
    assert mixed["reps"][0]["interference"]["chunk_tokens_engine_log"] == [8188] * 4 + [16]
    table = here(
        "export-table", str(out["h200-sglang"]), "--out", str(tmp_path / "t"), "--no-plots", "--no-parquet"
    )
    assert table.returncode == 0, table.stderr
    rows = list(csv.DictReader((tmp_path / "t" / "interference_table.csv").open()))
    assert len(rows) == 16 and {r["engine"] for r in rows} == {"pdexporter-sim-sglang"}
    rule = json.loads((tmp_path / "t" / "decision.json").read_text())["chunk_rule"]
    assert (rule["decodes_take_budget"], rule["decodes_in_chunk_step"]) == (False, False)
    decide = here(
        "decide",
        "-D",
        "4",
        "-P",
        "16384",
        "-B",
        "8192",
        "--model",
        str(tmp_path / "t" / "decision.json"),
        "--transfer-ms",
        "50",
        "--json",
    )
    assert decide.returncode == 0, decide.stderr
    assert json.loads(decide.stdout)["chunks"] == 2  # chunks of B = 8192 (vLLM's rule: 3 of B - D = 8188)
    wrong = here(
        "export-table",
        str(out["h200-sglang"]),
        "--engine",
        "pdexporter-sim-sglang-mixed",
        "--out",
        str(tmp_path / "t2"),
        "--no-plots",
        "--no-parquet",
    )
    assert (
        wrong.returncode == 2
        and "holds no records of that engine (engines: pdexporter-sim-sglang)"
        in wrong.stderr.strip().splitlines()[-1]
    )


def test_gpu_script_dry_run(tmp_path: Path) -> None:
    """scripts/gpu/sglang-h200.sh with the embedded engine standing in for SGLang: both modes run one
    after the other (each one's engine stopped before the next starts), every record is re-analysed
    without the log, and everything comes back as one tar.gz."""
    work, out = tmp_path / "work", tmp_path / "out"
    env = {**ENV, "PDX_SGL_DRY": "1", "PDX_SGL_WORK": str(work), "OUT": str(out), "PDX_SGL_PORT": str(free_port())}
    done = subprocess.run(
        ["bash", "scripts/gpu/sglang-h200.sh", "300"],
        check=False,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=420,
        env=env,
    )
    steps = (work / "steps.log").read_text()
    assert "default: sweep" in steps and "mixed: sweep" in steps, steps
    assert done.returncode in (0, 4, 5), done.stderr  # 4: a window failed on this loaded machine; 5: deadline
    with tarfile.open(out / "sglang.tar.gz") as tar:
        names = tar.getnames()
    for mode in ("default", "mixed"):
        assert f"{mode}/sweep.json" in names and f"{mode}/8192/engine/engine-trimmed.log" in names, names
        assert not any(n.endswith("/engine.log") for n in names)  # the full logs stay behind
    assert (out / "steps.log").exists()
    # (whether they agree is the virtual-clock test's: tests/integration/measure/test_sglang_without_log.py;
    # here, in real time on a loaded machine, a 512-token chunk may hide in the jitter)
    compared = json.loads((out / "without-log.json").read_text())
    for mode, rows in compared.items():
        assert rows and all(r["penalty_log_ms"] is not None for r in rows), (mode, rows)
    with pytest.raises(OSError):  # no engine left on the port
        urllib.request.urlopen(f"http://127.0.0.1:{env['PDX_SGL_PORT']}/health", timeout=2)
