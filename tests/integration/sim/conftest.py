from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]


@dataclass
class ServedEngine:
    url: str
    info: dict
    proc: subprocess.Popen
    log: Path

    def stop(self, timeout: float = 10.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout)


def start_sim_serve(tmp: Path, *args: str) -> ServedEngine:
    """`python -m pdexporter sim serve ... --port 0 --ready-file F`: SimLauncher's contract, by hand."""
    ready = tmp / "ready.json"
    log = tmp / "serve.log"
    cmd = [sys.executable, "-m", "pdexporter", "sim", "serve", "--port", "0", "--ready-file", str(ready), *args]
    with log.open("wb") as out:
        proc = subprocess.Popen(cmd, cwd=REPO, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                env={**os.environ, "PYTHONPATH": str(REPO)})
    deadline = time.monotonic() + 90  # a start-up bound, not a figure: a loaded 2-core machine is slow to import
    while not ready.exists():
        if proc.poll() is not None:
            raise RuntimeError(f"sim serve exited {proc.returncode}: {log.read_text()[-500:]}")
        if time.monotonic() > deadline:
            proc.kill()
            raise RuntimeError("sim serve not ready in 90 s")
        time.sleep(0.05)
    info = json.loads(ready.read_text())
    return ServedEngine(info["url"], info, proc, log)


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServedEngine]:
    engine = start_sim_serve(tmp_path_factory.mktemp("sim"), "--max-num-batched-tokens", "2048")
    try:
        yield engine
    finally:
        engine.stop()
