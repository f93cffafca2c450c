"""`pdexporter doctor` end to end: the embedded engine, `sim serve` as an external engine, a dead
port, an HTTP server answering 404 with an HTML page, a real Prometheus and a real OTLP receiver."""

from __future__ import annotations

import http.server
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers import free_port, stop_process
from tests.integration.exporter.exporter_realparts import OtlpReceiver
from tests.prometheus_server import PrometheusServer

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
ENV = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")} | {"COLUMNS": "400", "PYTHONPATH": str(ROOT)}


def doctor(*args: str, env: dict[str, str] | None = None) -> tuple[int, dict[str, tuple[str, str]], str]:
    """Run it; return (exit code, {check: (verdict, why)}, the whole output)."""
    done = subprocess.run([sys.executable, "-m", "pdexporter", "doctor", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=120, env=env or ENV)
    assert "Traceback" not in done.stderr, done.stderr
    rows: dict[str, tuple[str, str]] = {}
    for line in done.stdout.splitlines():
        cells = [c.strip() for c in line.strip().strip("│").split("│")]
        if len(cells) == 3 and cells[1] in ("ok", "warn", "fail", "skip"):
            rows[cells[0]] = (cells[1], cells[2])
    return done.returncode, rows, done.stdout + done.stderr


ENGINE_CHECKS = ["engine reachable", "version", "engine settings", "model", "max_model_len", "streaming", "metrics",
                 "chunk size", "step log", "prefix caching", "CUDA graphs"]


def test_embedded_engine() -> None:
    code, rows, out = doctor()
    assert code == 0, out
    assert list(rows) == [*ENGINE_CHECKS, "tracing imports", "Prometheus", "OTLP"], out
    assert rows["tracing imports"][0] == "ok" and "pdexporter's own OpenTelemetry SDK" in rows["tracing imports"][1]
    assert rows["engine reachable"][0] == "ok"
    assert rows["version"][0] == "warn" and "MODELLED" in rows["version"][1]
    assert rows["chunk size"] == ("ok", "8192 (the embedded engine was started with it)")
    assert rows["step log"][0] == "ok" and "chunk steps are exact" in rows["step log"][1]
    assert rows["prefix caching"][0] == "ok" and rows["prefix caching"][1].startswith("on ")
    assert rows["CUDA graphs"][0] == "ok" and "captured up to 512 tokens" in rows["CUDA graphs"][1]
    assert rows["streaming"][0] == "ok" and "4 tokens" in rows["streaming"][1]
    assert rows["Prometheus"][0] == rows["OTLP"][0] == "skip"
    assert "0 fail" in out


@pytest.fixture(scope="module")
def sim_serve(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """`pdexporter sim serve` in its own process: an engine pdexporter did not start."""
    port = free_port()
    log = (tmp_path_factory.mktemp("sim") / "serve.log").open("wb")
    proc = subprocess.Popen([sys.executable, "-m", "pdexporter", "sim", "serve", "--port", str(port), "-B", "4096"],
                            cwd=ROOT, env=ENV, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                import urllib.request

                with urllib.request.urlopen(f"{url}/health", timeout=1):
                    break
            except OSError:
                assert proc.poll() is None, "sim serve exited"
                time.sleep(0.2)
        yield url
    finally:
        stop_process(proc)
        log.close()


def test_external_engine_without_chunk_size_is_assumed_and_estimated(sim_serve: str) -> None:
    code, rows, out = doctor("--target", sim_serve)
    assert code == 0, out
    assert list(rows) == [*ENGINE_CHECKS, "tracing imports", "Prometheus", "OTLP"], out
    status, why = rows["tracing imports"]  # the engine's Python is elsewhere: what to run there
    assert status == "warn" and "cannot check from here" in why
    assert 'python3 -c "import opentelemetry.trace' in why and "otlp.proto.grpc.trace_exporter" in why
    status, why = rows["chunk size"]
    assert status == "warn" and "assumed 8192" in why and "checked by the cadence" in why
    status, why = rows["step log"]
    assert status == "warn" and "estimated from the probes' cadence" in why
    assert rows["CUDA graphs"][0] == "warn" and rows["CUDA graphs"][1].startswith("cannot tell")
    assert rows["prefix caching"][0] == "ok"  # from vllm:cache_config_info on its /metrics
    assert rows["max_model_len"][0] == "ok" and rows["max_model_len"][1].startswith("200000 tokens")

    code, rows, out = doctor("--target", sim_serve, "--chunk-size", "4096")
    assert code == 0 and rows["chunk size"] == ("ok", "4096 (given with --chunk-size)"), out


def test_embedded_engine_imitating_sglang() -> None:
    """`--engine sglang`: the embedded engine started as SGLang would be for pdexporter (its chunk
    flag, a step line per decode step, /metrics on): every check the numbers rest on passes."""
    code, rows, out = doctor("--engine", "sglang")
    assert code == 0, out
    assert rows["version"][0] == "warn" and "pdexporter-sim-sglang 0.5.15.post1" in rows["version"][1], out
    assert rows["engine settings"][0] == "ok", out
    assert rows["metrics"][0] == "ok" and "pdexporter-sim-sglang's names" in rows["metrics"][1], out
    assert rows["step log"][0] == "ok" and "chunk steps are exact" in rows["step log"][1], out
    assert rows["chunk size"] == ("ok", "8192 (the embedded engine was started with it)"), out


def test_an_sglang_at_a_url_says_its_chunk_size_and_what_it_lacks() -> None:
    """SGLang's defaults, as a user starts it: /server_info gives the chunk size; its decode steps
    are logged every 40th and /metrics is off, and doctor says which flags fix that."""
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "pdexporter", "sim", "serve", "--engine", "sglang", "--port",
                             str(port), "--chunked-prefill-size", "4096"], cwd=ROOT, env=ENV,
                            stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                import urllib.request

                with urllib.request.urlopen(f"{url}/health", timeout=1):
                    break
            except OSError:
                assert proc.poll() is None, "sim serve exited"
                time.sleep(0.2)
        code, rows, out = doctor("--target", url)
        assert code == 0, out
        assert rows["chunk size"] == ("ok", "4096 (the engine publishes it, /server_info)"), out
        assert rows["engine settings"][0] == "warn" and "--decode-log-interval 1" in rows["engine settings"][1]
        assert "--enable-metrics" in rows["engine settings"][1], out
        assert rows["metrics"][0] == "warn" and "HTTP 404" in rows["metrics"][1], out
        code, rows, out = doctor("--target", url, "--chunk-size", "8192")
        assert code == 1 and rows["chunk size"][0] == "fail" and "says 4096" in rows["chunk size"][1], out
    finally:
        stop_process(proc)


def test_unserved_model_fails(sim_serve: str) -> None:
    code, rows, out = doctor("--target", sim_serve, "--model", "no-such-model")
    assert code == 1, out
    assert rows["model"][0] == "fail" and "--model 'no-such-model' is not served" in rows["model"][1]


def test_dead_port_fails_in_one_line() -> None:
    port = free_port()  # nothing listens there
    code, rows, out = doctor("--target", f"http://127.0.0.1:{port}")
    assert code == 1, out
    assert rows["engine reachable"][0] == "fail" and f"127.0.0.1:{port}" in rows["engine reachable"][1]
    assert rows["engine checks"][0] == "skip"
    assert "FAIL: " in out


@pytest.fixture(scope="module")
def html_404(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    root = tmp_path_factory.mktemp("empty-site")
    handler = lambda *a, **k: http.server.SimpleHTTPRequestHandler(*a, directory=str(root), **k)  # noqa: E731
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.RequestHandlerClass.log_message = lambda *a, **k: None  # type: ignore[attr-defined]
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def test_html_404_server_is_one_line_never_the_page(html_404: str) -> None:
    code, rows, out = doctor("--target", html_404, "--prometheus", html_404, "--otlp", html_404)
    assert code == 1, out
    for name in ("engine reachable", "Prometheus", "OTLP"):
        status, why = rows[name]
        assert status == "fail", (name, out)
        assert "<" not in why and "DOCTYPE" not in why, why
    assert "HTTP 404" in rows["engine reachable"][1] and "an HTML page (Error response" in rows["engine reachable"][1]
    assert "HTML" not in out.replace("an HTML page", "")  # no markup anywhere in the output


def test_real_prometheus_and_otlp_receiver(tmp_path: Path) -> None:
    receiver = OtlpReceiver(tmp_path / "otlp")
    try:
        with PrometheusServer(tmp_path / "prom", targets=[]) as prometheus:
            code, rows, out = doctor("--prometheus", prometheus.url, "--otlp", receiver.endpoint)
            assert code == 0, out
            status, why = rows["Prometheus"]
            assert status == "ok" and "answered: Prometheus " in why and "holds no pdexporter series" in why, why
            status, why = rows["OTLP"]
            assert status == "ok" and f"{receiver.endpoint}/v1/traces" in why and "HTTP 200" in why, why
            assert [body for _, body in receiver.requests()] == [b""]  # the empty export, and nothing else

            env = ENV | {"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint}
            code, rows, out = doctor(env=env)
            assert code == 0 and rows["OTLP"][0] == "ok" and "OTEL_EXPORTER_OTLP_ENDPOINT" in rows["OTLP"][1], out
    finally:
        receiver.stop()
    code, rows, out = doctor("--otlp", receiver.endpoint)  # stopped now
    assert code == 1 and rows["OTLP"][0] == "fail" and "cannot connect" in rows["OTLP"][1], out


def _imports_ok(python: str) -> tuple[bool, str]:
    """What vLLM 0.22's tracing imports, tried directly in `python` (the test's own reference)."""
    from pdexporter.engines.vllm import TRACING_IMPORTS

    code = "; ".join(f"from {m} import {', '.join(names)}" for m, names in TRACING_IMPORTS)
    done = subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=60, check=False)
    return done.returncode == 0, done.stderr


def test_engine_python_is_checked_with_exactly_vllms_tracing_imports(sim_serve: str, tmp_path: Path) -> None:
    ok, error = _imports_ok(sys.executable)
    code, rows, out = doctor("--target", sim_serve, "--engine-python", sys.executable)
    status, why = rows["tracing imports"]
    if ok:
        assert code == 0 and status == "ok" and "both OTLP exporters" in why, out
    else:  # e.g. this machine has the HTTP exporter but not the gRPC one vLLM 0.22 imports as well
        missing = error.strip().splitlines()[-1].split("'")[1]
        assert code == 1 and status == "fail", out
        flat = " ".join(out.replace("│", " ").split())  # the verdict's whole line, however the table wrapped it
        assert (
            f"No module named '{missing}'" in flat and "HTTP 500" in flat and "Fix: pip install opentelemetry-" in flat
        )
    # a launcher command: its first word is the Python, or the #! of the script it names
    script = tmp_path / "vllm"
    script.write_text(f"#!{sys.executable}\nprint('a vllm entry point')\n")
    script.chmod(0o755)
    env = ENV | {"PATH": f"{tmp_path}:{os.environ['PATH']}"}
    code, rows2, out = doctor("--target", sim_serve, "--engine-command", "vllm serve m --port 8000", env=env)
    assert rows2["tracing imports"][0] == status and sys.executable in rows2["tracing imports"][1], out
    code, rows3, out = doctor("--target", sim_serve, "--engine-python", str(tmp_path / "missing-python"))
    assert code == 1 and rows3["tracing imports"][0] == "fail" and "cannot run it" in rows3["tracing imports"][1]


def test_traces_arrive_from_the_embedded_engine() -> None:
    code, rows, out = doctor("--traces")
    assert code == 0, out
    status, why = rows["traces arrive"]
    assert status == "ok" and "pdexporter's receiver" in why and "s after the request ended" in why, out


def test_no_span_at_the_receiver_fails_with_what_to_check(sim_serve: str) -> None:
    port = free_port()  # doctor listens there; the engine sends its spans nowhere
    code, rows, out = doctor("--target", sim_serve, "--traces", "--traces-receiver", f"127.0.0.1:{port}",
                             "--traces-wait", "2")
    assert code == 1, out
    status, why = rows["traces arrive"]
    assert status == "fail" and f"127.0.0.1:{port}/v1/traces" in why and "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL" in why
    code, rows, out = doctor("--target", sim_serve, "--traces", "--traces-receiver", "nonsense")
    assert code != 0 and "--traces-receiver 'nonsense': expected HOST:PORT" in out
