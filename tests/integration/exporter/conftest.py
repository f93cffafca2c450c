"""Fixtures over the real parts in `exporter_realparts` (Prometheus, an OTLP/HTTP receiver)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from exporter_realparts import PROMETHEUS, OtlpReceiver, PrometheusServer


@pytest.fixture
def otlp_receiver() -> Any:
    receiver = OtlpReceiver().start()
    yield receiver
    receiver.stop()


@pytest.fixture
def prometheus_factory(tmp_path: Path) -> Any:
    if not Path(PROMETHEUS).exists():
        pytest.fail(f"{PROMETHEUS} is missing: scripts/test.sh installs Debian's prometheus package")
    servers: list[PrometheusServer] = []

    def start(targets: list[str]) -> PrometheusServer:
        workdir = tmp_path / f"prometheus{len(servers)}"
        workdir.mkdir()
        server = PrometheusServer(workdir, targets)
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.stop()
