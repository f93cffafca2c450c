"""A URL that reaches a server speaking something else than HTTP (an SSH port, say) is one line naming it,
not a traceback: urllib raises `http.client.BadStatusLine`, which is neither an OSError nor a URLError."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator

import pytest

from pdexporter.doctor.gather import otlp_facts
from pdexporter.exporter import prometheus as pm


@pytest.fixture
def ssh_port() -> Iterator[int]:
    """A real TCP server that greets every connection as an SSH server does (a test double of one)."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    server.settimeout(0.2)
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except TimeoutError:
                continue
            with conn:
                conn.sendall(b"SSH-2.0-OpenSSH_9.6\r\n")
                conn.settimeout(1.0)
                try:
                    conn.recv(65536)
                except OSError:
                    pass

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield server.getsockname()[1]
    finally:
        stop.set()
        thread.join(2.0)
        server.close()


def test_prometheus_at_a_non_http_server_is_one_line(ssh_port: int) -> None:
    api = pm.PrometheusAPI(f"http://127.0.0.1:{ssh_port}", timeout_s=5.0)
    with pytest.raises(pm.PrometheusError) as info:
        api.query_range("up", 0, 10, 1)
    text = str(info.value)
    assert f"127.0.0.1:{ssh_port} is not an HTTP server" in text and "SSH-2.0-OpenSSH_9.6" in text
    assert "\n" not in text


def test_doctor_says_an_otlp_endpoint_is_not_http(ssh_port: int) -> None:
    facts = otlp_facts(f"http://127.0.0.1:{ssh_port}/v1/traces", env={}, timeout_s=5.0)
    assert facts.error is not None and facts.error.startswith("not an HTTP answer"), facts
