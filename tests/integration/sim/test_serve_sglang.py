"""`pdexporter sim serve --engine sglang [--enable-mixed-chunk]`: the embedded engine over real HTTP
says who it is, logs and names its metrics as SGLang 0.5.15 does, and its steps follow SGLang's
policy in both modes (read back through the SGLang adapters, as from a real SGLang)."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from pdexporter.client.metrics import parse_exposition
from pdexporter.engines import adapter, identify
from tests.integration.sim.conftest import start_sim_serve

pytestmark = pytest.mark.integration

MODEL = "qwen3-coder-30b-a3b"


def get(url: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=10) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def complete(url: str, prompt: list[int], max_tokens: int) -> None:
    body = json.dumps(
        {"model": MODEL, "prompt": prompt, "max_tokens": max_tokens, "ignore_eos": True}
    ).encode()
    request = urllib.request.Request(
        f"{url}/v1/completions", data=body, headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=60) as resp:
        assert resp.status == 200


def steps_logged(log: Path, name: str, wanted: int, timeout_s: float = 10.0) -> list:
    deadline = time.monotonic() + timeout_s
    while True:
        steps = adapter(name).parse_step_log(log.read_text().splitlines())
        if len(steps) >= wanted or time.monotonic() > deadline:
            return steps
        time.sleep(0.05)


@pytest.mark.parametrize("mixed", [False, True], ids=["default", "mixed-chunk"])
def test_sglang_imitation_over_http(tmp_path: Path, mixed: bool) -> None:
    name = "pdexporter-sim-sglang-mixed" if mixed else "pdexporter-sim-sglang"
    served = start_sim_serve(
        tmp_path,
        "--engine",
        "sglang",
        "--chunked-prefill-size",
        "2048",
        "--decode-log-interval",
        "1",
        "--enable-metrics",
        *(["--enable-mixed-chunk"] if mixed else []),
    )
    try:
        url = served.url
        assert served.info["engine"] == name
        assert get(f"{url}/version")[0] == 404  # SGLang serves no /version
        status, body = get(f"{url}/server_info")
        info = json.loads(body)
        assert status == 200 and info["modelled"] is True and info["version"] == "0.5.15.post1+pdexporter.sim"
        assert info["chunked_prefill_size"] == 2048 and info["enable_mixed_chunk"] is mixed
        assert identify(info, "/server_info").name == name  # type: ignore[union-attr]
        # four decodes running, then a 5000-token prompt beside them
        import threading

        decodes = [
            threading.Thread(target=complete, args=(url, list(range(100 + i, 116 + i)), 120))
            for i in range(4)
        ]
        for t in decodes:
            t.start()
        time.sleep(0.3)
        complete(url, list(range(20_000, 25_000)), 1)
        for t in decodes:
            t.join()
        steps = steps_logged(served.log, name, 10)
        chunks = [s for s in steps if s.context_tokens > 1000]
        if mixed:
            assert [s.context_tokens for s in chunks] == [2044, 2044] and all(
                s.generation_requests == 4 for s in chunks
            )
        else:
            assert [s.context_tokens for s in chunks] == [2048, 2048] and all(
                s.generation_requests == 0 for s in chunks
            )
        assert any(
            s.context_tokens == 0 and s.generation_requests == 4 for s in steps
        )  # a line per decode step
        lines = served.log.read_text()
        assert "] Prefill batch, #new-seq: " in lines and "] Decode batch, #running-req: " in lines
        status, text = get(f"{url}/metrics")
        snap = parse_exposition(text.decode(), adapter(name))
        assert status == 200 and snap.missing == ()
        assert (
            snap.values["request_success_total"] == 5.0
            and snap.values["prompt_tokens_total"] == 5000 + 4 * 16
        )
        assert snap.sources["num_requests_running"] == "sglang:num_running_reqs"
    finally:
        assert served.stop() == 0


def test_sglang_defaults_hide_metrics_and_most_decode_lines(tmp_path: Path) -> None:
    """As SGLang does unless told: /metrics only with --enable-metrics, a Decode batch line every
    40th decode step; the identity says so (what doctor reads)."""
    served = start_sim_serve(tmp_path, "--engine", "sglang")
    try:
        assert get(f"{served.url}/metrics")[0] == 404
        info = json.loads(get(f"{served.url}/server_info")[1])
        assert info["decode_log_interval"] == 40 and info["enable_metrics"] is False
        complete(served.url, list(range(100, 116)), 81)
        steps = steps_logged(served.log, "pdexporter-sim-sglang", 3)
        assert [s.context_tokens for s in steps if s.context_tokens] == [16]
        assert len([s for s in steps if not s.context_tokens]) == 2  # 80 decode steps, every 40th logged
    finally:
        assert served.stop() == 0
