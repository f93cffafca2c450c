"""Helpers shared by tests (importable as `tests.helpers`)."""

from __future__ import annotations

import json
import socket
import subprocess
from pathlib import Path
from typing import Any

FIXTURES = Path(__file__).resolve().parent / "fixtures"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def stop_process(proc: subprocess.Popen[bytes], timeout: float = 10.0) -> None:
    """SIGTERM, then SIGKILL if it has not exited within `timeout` seconds."""
    if proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def seed_record_example() -> dict[str, Any]:
    """The seed's "Per-Run Record" example, verbatim (a fresh copy each call)."""
    return json.loads((FIXTURES / "seed" / "per-run-record.json").read_text())
