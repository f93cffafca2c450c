"""`pdexporter run` as a user runs it: a real process, the embedded engine, signals, bad input."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from tests.helpers import free_port

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]


def _run(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pdexporter", "run", *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout
    )


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--listen", "localhost"], "pdexporter: error: --listen 'localhost': expected HOST:PORT"),
        (["--listen", "127.0.0.1:99999"], "pdexporter: error: --listen '127.0.0.1:99999': port out of range"),
        (["--decode-batch-size", "0"], "pdexporter: error: --decode-batch-size 0: must be >= 1"),
        (["--new-prefill-tokens", "0"], "pdexporter: error: --new-prefill-tokens 0: must be >= 1"),
        (["--inject-every", "often"], "pdexporter: error: --inject-every 'often': expected a duration"),
        # run waits for its engine (forever by default, issue 13); --engine-wait bounds the wait
        (["--target", "http://127.0.0.1:9/", "--chunk-size", "8192", "--listen", "127.0.0.1:0", "--engine-wait", "2s"],
         "pdexporter: error: engine not ready after 2 s (--engine-wait): cannot connect to http://127.0.0.1:9/health"),
    ],
)
def test_bad_input_is_one_line_and_a_non_zero_exit(args: list[str], message: str) -> None:
    result = _run(*args)
    assert result.returncode != 0
    lines = [line for line in result.stderr.splitlines() if line.startswith("pdexporter: error:")]
    assert len(lines) == 1 and lines[0].startswith(message), result.stderr
    assert "Traceback" not in result.stderr


def test_listen_port_in_use_is_one_line() -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        result = _run("--listen", f"127.0.0.1:{port}", "--target", "http://127.0.0.1:9", "--chunk-size", "8192")
    assert result.returncode == 2
    assert result.stderr.strip().splitlines()[-1].startswith(f"pdexporter: error: --listen 127.0.0.1:{port}: ")
    assert "Traceback" not in result.stderr


def _children(pid: int) -> set[int]:
    out = subprocess.run(["ps", "-o", "pid=", "--ppid", str(pid)], capture_output=True, text=True).stdout
    return {int(p) for p in out.split()}


@pytest.mark.parametrize("stop", [signal.SIGTERM, signal.SIGHUP])  # SIGHUP killed it at once (session 22's audit)
def test_sigterm_stops_cleanly_with_windows_recorded(tmp_path: Path, stop: signal.Signals) -> None:
    port = free_port()
    out = tmp_path / "results"
    proc = subprocess.Popen(
        [sys.executable, "-m", "pdexporter", "run", "--decode-batch-size", "2", "--chunk-size", "2048",
         "--new-prefill-tokens", "3000", "--inject-every", "500ms", "--decode-output-tokens", "96",
         "--listen", f"127.0.0.1:{port}", "--out", str(out), "--scrape-interval", "1s"],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "COLUMNS": "200"},
    )
    assert proc.stderr is not None
    lines: list[str] = []
    try:
        deadline = time.monotonic() + 60
        while not any(line.startswith("window 1:") for line in lines):
            assert proc.poll() is None, "".join(lines) + proc.stderr.read()
            assert time.monotonic() < deadline, "".join(lines)
            lines.append(proc.stderr.readline())
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
            text = resp.read().decode()
        engine = _children(proc.pid)
        assert engine, "the embedded engine should be a child process"
        proc.send_signal(stop)
        stdout, rest = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    lines += rest.splitlines(keepends=True)
    assert proc.returncode == 0, "".join(lines)
    assert f"{stop.name}: finishing the window in flight, then stopping" in "".join(lines)
    windows = [line for line in lines if line.startswith("window ")]
    assert any(line.startswith(f"stopped after {len(windows)} window(s)") for line in lines), "".join(lines)
    assert "pdexporter_up 1.0" in text
    assert 'pdexporter_probe_tpot_seconds_count{phase="baseline"}' in text
    assert 'pdexporter_engine_info{chunk_size="2048",chunk_size_source="given",engine="pdexporter-sim"' in text
    # The embedded engine went with the exporter, and every window is a repetition on disk.
    for pid in engine:
        assert not Path(f"/proc/{pid}").exists() or "zombie" in Path(f"/proc/{pid}/status").read_text().lower()
    record = json.loads((out / "2048" / "D2_P3000.json").read_text())
    assert len(record["reps"]) == len(windows)
    assert record["config"]["modelled"] is True and record["config"]["mode"] == "live"


def test_sigterm_with_the_otlp_collector_down_stops_within_the_flush_limit(tmp_path: Path) -> None:
    """Spans queued for a collector that is down: the exit waits 5 s for them, not the OTLP
    exporter's retries (its timeout is 30 s here; the SDK's force_flush ignores its own)."""
    env = {**os.environ, "COLUMNS": "200", "OTEL_EXPORTER_OTLP_TRACES_TIMEOUT": "30",
           "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": f"http://127.0.0.1:{free_port()}/v1/traces"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "pdexporter", "run", "-D", "2", "-B", "2048", "-P", "512", "--inject-every", "500ms",
         "--decode-output-tokens", "96", "--listen", f"127.0.0.1:{free_port()}"],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
    )
    assert proc.stderr is not None
    lines: list[str] = []
    try:
        deadline = time.monotonic() + 60
        while not any(line.startswith("window 2:") for line in lines):  # spans queued, an export retrying
            assert proc.poll() is None, "".join(lines) + proc.stderr.read()
            assert time.monotonic() < deadline, "".join(lines)
            lines.append(proc.stderr.readline())
        t0 = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=90)
        took = time.monotonic() - t0
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, "".join(lines)
    assert took < 20, took  # the window in flight + 5 s (~6 s here); ~30 s before
