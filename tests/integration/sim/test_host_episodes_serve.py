"""`sim serve --host-speed switching`: the embedded engine served with slow-host episodes in time says so when it is
ready and serves as ever (a real process on a real port; the switching itself: tests/unit/sim/test_episodes.py)."""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path

import pytest

from pdexporter.sim.profile import load_profile
from tests.integration.sim.conftest import start_sim_serve

pytestmark = pytest.mark.integration


def test_a_switching_engine_says_so_and_serves(tmp_path: Path) -> None:
    engine = start_sim_serve(tmp_path, "--host-speed", "switching", "--max-num-batched-tokens", "2048")
    try:
        body = json.dumps({"model": engine.info["model"], "prompt": "hello " * 600, "max_tokens": 2}).encode()
        req = urllib.request.Request(engine.url + "/v1/completions", data=body,
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=60) as resp:
            answer = json.loads(resp.read())
        assert answer["usage"]["completion_tokens"] == 2
    finally:
        assert engine.stop() == 0
    host = load_profile(engine.info.get("profile") or "h200-qwen3-coder-30b-a3b").host  # the default profile's
    log = engine.log.read_text()
    assert f"slow-host episodes: CPU x {host.slow_factor:.2f} {host.slow_fraction:.0%} of the time, ~2.5 s each" in log
    assert host.slow_factor > 1 and 0 < host.slow_fraction < 1
