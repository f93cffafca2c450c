"""`pdexporter sim serve` (a subprocess, real HTTP) driven by clients written for vLLM, not pdexporter."""

from __future__ import annotations

import asyncio
import json
import signal
import time
import urllib.request
from pathlib import Path
from typing import TYPE_CHECKING

import aiohttp
import pytest

from pdexporter.client.metrics import parse_exposition
from pdexporter.engines import adapter
from tests.helpers import free_port
from tests.integration.sim.conftest import ServedEngine, start_sim_serve

if TYPE_CHECKING:  # imported where used: 0.7 s of every test worker's collection otherwise
    import openai

pytestmark = pytest.mark.integration

MODEL = "qwen3-coder-30b-a3b"
FIXTURE = Path(__file__).parents[2] / "fixtures" / "vllm-0.22" / "sse-completions.txt"  # a real vLLM 0.22.0


@pytest.fixture(scope="module")
def client(served: ServedEngine) -> openai.OpenAI:
    import openai

    return openai.OpenAI(base_url=f"{served.url}/v1", api_key="EMPTY", max_retries=0, timeout=60)


def test_ready_file_is_the_launchers_contract(served: ServedEngine):
    info = served.info
    assert info["url"].startswith("http://127.0.0.1:")
    assert {"url", "gpu", "version", "cuda_graphs", "pid"} <= set(info)
    assert info["pid"] == served.proc.pid and info["gpu"] == "H200" and info["cuda_graphs"] is True
    assert info["modelled"] is True and "+pdexporter.sim" in info["version"]


def test_openai_models(client: openai.OpenAI):
    models = client.models.list()
    assert [m.id for m in models.data] == [MODEL]


def test_openai_streaming_completion_with_token_ids(client: openai.OpenAI):
    stream = client.completions.create(
        model=MODEL, prompt=list(range(1000, 1300)), max_tokens=12, temperature=0, stream=True,
        stream_options={"include_usage": True, "continuous_usage_stats": True}, extra_body={"ignore_eos": True},
    )
    chunks = list(stream)
    texts = [c.choices[0].text for c in chunks if c.choices]
    # One event per token, unless this client fell behind (a loaded machine): then the tokens that
    # waited come merged in one event, as vLLM's output collector merges them.
    assert len("".join(texts).split()) == 12 and all(t.startswith(" t") for t in texts)
    finals = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert finals[-1] == "length" and set(finals[:-1]) == {None}
    usage = chunks[-1].usage
    assert chunks[-1].choices == [] and (usage.prompt_tokens, usage.completion_tokens) == (300, 12)
    counts = [c.usage.completion_tokens for c in chunks if c.choices]
    assert counts[-1] == 12 and [len(t.split()) for t in texts] == [b - a for a, b in zip([0, *counts], counts)]
    assert "pdexporter-sim" in (chunks[-1].system_fingerprint or "")


def test_openai_streaming_chat_opens_with_a_role_delta(client: openai.OpenAI):
    stream = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "t11 t12 hello world"}], max_tokens=5, stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    assert chunks[0].object == "chat.completion.chunk"
    assert chunks[0].choices[0].delta.role == "assistant" and chunks[0].choices[0].delta.content == ""
    content = [c.choices[0].delta.content for c in chunks[1:] if c.choices]
    # vLLM's front end merges the tokens a slow reader has not taken yet into one event (so does the
    # embedded engine's, on a busy machine): count tokens, not events
    assert "".join(content).split() and len("".join(content).split()) == 5
    assert all(x.startswith(" t") for x in content if x)
    assert chunks[-2].choices[0].finish_reason == "length"
    assert chunks[-1].usage.prompt_tokens == 4 and chunks[-1].usage.completion_tokens == 5


def test_openai_non_streaming(client: openai.OpenAI):
    done = client.completions.create(model=MODEL, prompt="t1 t2 t3", max_tokens=4)
    assert done.choices[0].finish_reason == "length" and len(done.choices[0].text.split()) == 4
    assert done.usage.prompt_tokens == 3 and done.usage.total_tokens == 7
    chat = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=3)
    assert chat.choices[0].message.role == "assistant" and len(chat.choices[0].message.content.split()) == 3


def test_openai_sees_vllm_errors(client: openai.OpenAI):
    import openai

    with pytest.raises(openai.BadRequestError) as err:
        client.completions.create(model=MODEL, prompt=[5] * 100, max_tokens=199_950)
    assert "maximum context length is 200000 tokens" in str(err.value)
    assert err.value.status_code == 400
    with pytest.raises(openai.NotFoundError) as missing:
        client.completions.create(model="gpt-4", prompt="hi", max_tokens=2)
    assert "The model `gpt-4` does not exist." in str(missing.value)


def test_raw_aiohttp_sse_has_vllms_exact_shape(served: ServedEngine):
    async def main() -> tuple[bytes, dict]:
        async with aiohttp.ClientSession() as session:
            body = {"model": MODEL, "prompt": [7] * 64, "max_tokens": 6, "stream": True, "temperature": 0,
                    "ignore_eos": True}
            async with session.post(f"{served.url}/v1/completions", json=body) as resp:
                assert resp.status == 200
                assert resp.headers["Content-Type"].startswith("text/event-stream")
                return await resp.read(), dict(resp.headers)

    raw, headers = asyncio.run(main())
    assert headers.get("x-pdexporter-modelled") == "true"
    events = raw.decode().split("\n\n")
    assert events[-1] == "" and events[-2] == "data: [DONE]"
    payloads = [json.loads(e.removeprefix("data: ")) for e in events[:-2]]
    # One event per engine step (six); a writer that fell behind (a loaded machine) sends several
    # steps' tokens in one event, as vLLM's output collector merges them: six tokens either way.
    assert 1 <= len(payloads) <= 6
    assert len("".join(p["choices"][0]["text"] for p in payloads).split()) == 6  # a token reads " t<id>"
    real = json.loads(FIXTURE.read_text().split("\n\n")[0].removeprefix("data: "))
    for p in payloads:
        assert list(p["choices"][0]) == list(real["choices"][0])
        assert p["id"].startswith("cmpl-") and len(p["id"]) == len(real["id"])
    for p in payloads[:-1]:
        assert list(p) == list(real)  # same keys, same order, no usage without stream_options
    # vLLM stamps system_fingerprint on the terminal chunk when no usage chunk follows
    assert list(payloads[-1]) == [*real, "system_fingerprint"]
    assert payloads[-1]["choices"][0]["finish_reason"] == "length"


def test_continuous_usage_needs_include_usage_as_in_vllm(served: ServedEngine):
    async def events(options: dict) -> list[dict]:
        async with aiohttp.ClientSession() as session:
            body = {"model": MODEL, "prompt": [3] * 20, "max_tokens": 3, "stream": True, "stream_options": options}
            async with session.post(f"{served.url}/v1/completions", json=body) as resp:
                raw = (await resp.read()).decode()
        return [json.loads(e.removeprefix("data: ")) for e in raw.split("\n\n") if e.startswith("data: {")]

    alone = asyncio.run(events({"continuous_usage_stats": True}))
    both = asyncio.run(events({"include_usage": True, "continuous_usage_stats": True}))
    # One event per step (three) on an idle machine; a writer that fell behind merges steps' tokens
    # into one event, as vLLM's output collector does (2 events for 3 tokens beside a CPU burner).
    assert all("usage" not in e for e in alone) and 1 <= len(alone) <= 3
    assert len("".join(e["choices"][0]["text"] for e in alone).split()) == 3  # a token reads " t<id>"
    counts = [e["usage"]["completion_tokens"] for e in both]
    assert counts[-2:] == [3, 3] and counts == sorted(counts) and len(set(counts)) == len(counts) - 1
    assert both[-1]["choices"] == [] and all(e["choices"] for e in both[:-1])


def test_health_version_tokenize_metrics(served: ServedEngine):
    async def main() -> dict:
        out = {}
        async with aiohttp.ClientSession() as s:
            async with s.get(f"{served.url}/health") as r:
                out["health"] = r.status
            async with s.get(f"{served.url}/version") as r:
                out["version"] = await r.json()
            async with s.post(f"{served.url}/tokenize", json={"model": MODEL, "prompt": "t3 t4 abc"}) as r:
                out["tokenize"] = await r.json()
            # a prompt of its own, so that the counters below do not rest on the module's other tests
            async with s.post(f"{served.url}/v1/completions",
                              json={"model": MODEL, "prompt": [5] * 8, "max_tokens": 1}) as r:
                await r.read()
            async with s.get(f"{served.url}/metrics") as r:
                out["metrics"] = await r.text()
                out["metrics_type"] = r.headers["Content-Type"]
            async with s.get(f"{served.url}/nope") as r:
                out["404"] = (r.status, await r.json())
        return out

    out = asyncio.run(main())
    assert out["health"] == 200
    assert out["version"]["modelled"] is True and out["version"]["engine"] == "pdexporter-sim"
    assert out["tokenize"]["count"] == 3 and out["tokenize"]["tokens"][:2] == [3, 4]
    assert out["tokenize"]["max_model_len"] == 200_000
    snap = parse_exposition(out["metrics"], adapter("pdexporter-sim"))
    assert snap.model_names == (MODEL,) and snap.get("prompt_tokens_total") > 0
    assert "vllm:cache_config_info" in out["metrics"] and "python_gc_objects_collected_total" in out["metrics"]
    assert out["metrics_type"].startswith("text/plain")
    assert out["404"][0] == 404 and out["404"][1]["error"]["code"] == 404


def test_a_client_that_disconnects_aborts_its_request(tmp_path: Path):
    engine = start_sim_serve(tmp_path, "--max-num-batched-tokens", "8192")
    try:
        async def main() -> dict:
            async with aiohttp.ClientSession() as s:
                body = {"model": MODEL, "prompt": [9] * 32, "max_tokens": 100_000, "stream": True}
                resp = await s.post(f"{engine.url}/v1/completions", json=body)
                got = 0
                async for line in resp.content:
                    if line.startswith(b"data: {"):
                        got += 1
                        if got == 5:
                            break
                resp.close()  # the client goes away mid-stream
                deadline = time.monotonic() + 30  # how long the abort may take to show, not a figure
                while True:
                    async with s.get(f"{engine.url}/metrics") as r:
                        text = await r.text()
                    snap = parse_exposition(text, adapter("pdexporter-sim"))
                    if snap.get("num_requests_running") == 0 or time.monotonic() > deadline:
                        return {"snap": snap, "text": text}
                    await asyncio.sleep(0.1)

        out = asyncio.run(main())
        assert out["snap"].get("num_requests_running") == 0
        assert 'vllm:request_success_total{engine="0",finished_reason="abort",model_name="qwen3-coder-30b-a3b"} 1.0' \
            in out["text"]
    finally:
        assert engine.stop(timeout=30) == 0  # SIGTERM: a clean exit
    assert "embedded engine stopped" in engine.log.read_text()


def test_sigterm_with_a_stream_in_flight_stops_the_engine_at_once(tmp_path: Path):
    """A stopping engine cuts its open streams (vLLM aborts its requests); aiohttp's default
    graceful wait (60 s, twice) kept it alive for two minutes, past every launcher's stop timeout."""
    engine = start_sim_serve(tmp_path, "--max-num-batched-tokens", "8192")
    got: list[bytes] = []

    async def read_forever() -> None:
        async with aiohttp.ClientSession() as s:
            body = {"model": MODEL, "prompt": [9] * 32, "max_tokens": 100_000, "stream": True}
            async with s.post(f"{engine.url}/v1/completions", json=body) as resp:
                async for line in resp.content:
                    got.append(line)

    async def main() -> float:
        reader = asyncio.create_task(read_forever())
        while len(got) < 5:
            assert not reader.done(), reader
            await asyncio.sleep(0.05)
        t0 = time.monotonic()
        engine.proc.send_signal(signal.SIGTERM)
        await asyncio.to_thread(engine.proc.wait, 60)
        took = time.monotonic() - t0
        reader.cancel()
        await asyncio.gather(reader, return_exceptions=True)
        return took

    try:
        took = asyncio.run(main())
    finally:
        if engine.proc.poll() is None:
            engine.proc.kill()
    assert engine.proc.returncode == 0 and took < 20, took  # 120 s before; ~1-2 s here (a bound, not a figure)
    assert "embedded engine stopped" in engine.log.read_text()


def test_sigterm_with_its_trace_receiver_gone_stops_the_engine_at_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """The OTLP receiver often stops before the engine (`run --passive` beside `sim serve`): the
    spans still queued must not hold the exit for the exporter's retries (~7 s at the SDK's 10 s
    timeout, a teardown of the dashboard test measured 10 s; here the timeout is 30 s)."""
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_TIMEOUT", "30")
    nobody = f"http://127.0.0.1:{free_port()}/v1/traces"
    engine = start_sim_serve(tmp_path, "--max-num-batched-tokens", "2048", "--otlp-traces-endpoint", nobody)
    try:
        body = {"model": MODEL, "prompt": [9] * 32, "max_tokens": 4}
        for _ in range(3):  # three finished requests: three spans for nobody
            with urllib.request.urlopen(urllib.request.Request(
                    f"{engine.url}/v1/completions", data=json.dumps(body).encode(),
                    headers={"Content-Type": "application/json"}), timeout=30) as resp:
                assert resp.status == 200
        t0 = time.monotonic()
        assert engine.stop(timeout=60) == 0
        took = time.monotonic() - t0
    finally:
        if engine.proc.poll() is None:
            engine.proc.kill()
    assert took < 10, took  # ~1 s here; 15.6 s with the unbounded flush before
    assert "embedded engine stopped" in engine.log.read_text()
