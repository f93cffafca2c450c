"""A P/D pair of embedded engines over real HTTP: `sim serve --kv-role prefill|decode|decode-bench`
answered by plain aiohttp (the requests a P/D router sends, vLLM's toy proxy's shapes), and the
routing driver (`measure.pd.PdDriver`) measuring a point through the pair and in virtual time."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import aiohttp
import pytest

from pdexporter._internal.vloop import run_virtual
from pdexporter.client.metrics import metric_deltas, parse_exposition
from pdexporter.engines import adapter
from pdexporter.launch.sim import SimLauncher
from pdexporter.measure.pd import PdDriver, pd_driver
from pdexporter.measure.point import PointSpec, measure_point
from pdexporter.measure.protocol import ProtocolSettings, warm_prefix, warm_shapes
from pdexporter.measure.sim_driver import SimDriver
from pdexporter.measure.store import ResultsStore
from pdexporter.sim.profile import load_profile
from tests.integration.sim.conftest import ServedEngine, start_sim_serve

pytestmark = pytest.mark.integration

MODEL = "qwen3-coder-30b-a3b"
PROFILE = load_profile("h200-qwen3-coder-30b-a3b")


@pytest.fixture(scope="module")
def pair(tmp_path_factory) -> tuple[ServedEngine, ServedEngine]:
    prefill = start_sim_serve(tmp_path_factory.mktemp("prefill"), "--kv-role", "prefill")
    decode = start_sim_serve(tmp_path_factory.mktemp("decode"), "--kv-role", "decode")
    yield prefill, decode
    prefill.stop()
    decode.stop()


async def _post(session: aiohttp.ClientSession, url: str, body: dict) -> tuple[int, bytes]:
    async with session.post(url, json=body) as resp:
        return resp.status, await resp.read()


def test_a_router_routes_a_request_through_the_pair(pair) -> None:
    prefill, decode = pair
    prompt = list(range(1000, 1000 + 8192))

    async def main() -> tuple[dict, list[dict], str, str, dict]:
        async with aiohttp.ClientSession() as s:
            version = json.loads(await (await s.get(f"{decode.url}/version")).read())
            metrics_before = (await (await s.get(f"{decode.url}/metrics")).read()).decode()
            status, raw = await _post(s, f"{prefill.url}/v1/completions", {
                "model": MODEL, "prompt": prompt, "max_tokens": 1, "stream": False,
                "kv_transfer_params": {"do_remote_decode": True, "do_remote_prefill": False, "remote_engine_id": None,
                                       "remote_block_ids": None, "remote_host": None, "remote_port": None}})
            assert status == 200, raw
            answer = json.loads(raw)
            events = []
            async with s.post(f"{decode.url}/v1/completions", json={
                    "model": MODEL, "prompt": prompt, "max_tokens": 4, "stream": True, "ignore_eos": True,
                    "kv_transfer_params": answer["kv_transfer_params"]}) as resp:
                assert resp.status == 200
                async for line in resp.content:
                    if line.startswith(b"data: {"):
                        events.append(json.loads(line[6:]))
            metrics_after = (await (await s.get(f"{decode.url}/metrics")).read()).decode()
        return answer, events, metrics_before, metrics_after, version

    answer, events, before, after, version = asyncio.run(main())
    params = answer["kv_transfer_params"]
    assert params["do_remote_prefill"] is True and len(params["remote_block_ids"]) == 8192 // 16
    assert params["remote_num_tokens"] == 8192 and params["remote_port"] == 5600  # VLLM_NIXL_SIDE_CHANNEL_PORT default
    # four tokens (" t<id>" each), in as many events as the engine wrote: a loaded engine merges
    # tokens that became ready together into one event, as vLLM does
    assert len("".join(e["choices"][0]["text"] for e in events if e["choices"]).split()) == 4
    assert version["kv_role"] == "decode" and version["modelled"] is True
    deltas = metric_deltas(
        parse_exposition(before, adapter("pdexporter-sim")), parse_exposition(after, adapter("pdexporter-sim"))
    )
    assert deltas["kv_transfer_bytes_sum_delta"] == 8192 * PROFILE.model.kv_bytes_per_token
    assert deltas["kv_transfer_time_seconds_sum_delta"] == pytest.approx(
        PROFILE.kv_transfer.seconds(8192, PROFILE.model.kv_bytes_per_token), rel=1e-6)


def test_the_pair_refuses_what_it_cannot_load(pair) -> None:
    prefill, decode = pair

    async def main() -> list[tuple[int, dict]]:
        out = []
        async with aiohttp.ClientSession() as s:
            for url, params in (
                (decode.url, {"do_remote_prefill": True, "remote_request_id": "x"}),
                (
                    prefill.url,
                    {
                        "do_remote_prefill": True,
                        "remote_block_ids": [1],
                        "remote_engine_id": "e",
                        "remote_request_id": "r",
                        "remote_host": "h",
                        "remote_port": 1,
                    },
                ),
            ):
                status, raw = await _post(
                    s,
                    f"{url}/v1/completions",
                    {"model": MODEL, "prompt": [1, 2, 3], "max_tokens": 1, "kv_transfer_params": params},
                )
                out.append((status, json.loads(raw)))
        return out

    (s1, e1), (s2, e2) = asyncio.run(main())
    assert s1 == 400 and "lacks remote_block_ids, remote_engine_id, remote_host, remote_port" in e1["error"]["message"]
    assert s2 == 400 and "needs a decode instance" in e2["error"]["message"]


def test_the_routing_driver_measures_a_point_through_the_pair(tmp_path: Path) -> None:
    settings = ProtocolSettings()

    async def main():  # type: ignore[no-untyped-def]
        prefill = SimLauncher(kv_role="prefill", log_dir=tmp_path / "p")
        decode = SimLauncher(kv_role="decode", log_dir=tmp_path / "d")
        try:
            p_handle, d_handle = await asyncio.gather(prefill.start(8192), decode.start(8192))
            async with pd_driver(p_handle, d_handle) as driver:
                await warm_prefix(driver, settings)
                await warm_shapes(driver, [4096], settings)
                return await measure_point(driver, PointSpec(8192, 2, 4096), settings, ResultsStore(tmp_path / "r"),
                                           reps=1)
        finally:
            await asyncio.gather(prefill.stop(), decode.stop())

    record = asyncio.run(main())
    c, i = record.config, record.interference
    assert (c.engine, c.arm, c.kv_connector) == ("pdexporter-sim-pd-decode", "offloaded", "NixlConnector")
    assert c.prefill_engine["engine"] == "pdexporter-sim-pd-prefill" and c.modelled
    assert i.num_chunks_expected == 1 and i.chunk_tokens_engine_log == [1] and i.num_chunks_source == "engine-log"
    # the TTFT is the sum of the measured parts; the route term is this client's own work between them
    assert i.offload_ttft_ms == pytest.approx(i.offload_prefill_ms + i.offload_route_ms + i.offload_decode_ms, abs=2e-3)
    assert 0 <= i.offload_route_ms < 0.2 * i.offload_prefill_ms
    assert i.offload_decode_ms == pytest.approx(i.prefill_duration_ms, abs=1e-3)  # the window is the decode half
    expected = PROFILE.kv_transfer.seconds(4096, PROFILE.model.kv_bytes_per_token) * 1e3
    assert i.kv_transfer_ms == pytest.approx(expected, rel=1e-3) and i.kv_bytes == 4096 * 98304
    assert i.offload_decode_ms > i.kv_transfer_ms  # the decode half holds the transfer and the admission step
    raw = ResultsStore(tmp_path / "r").load_raw(tmp_path / "r" / "8192" / record.reps[0].raw)
    route = raw["offload"]
    assert route["connector"] == "NixlConnector" and route["kv_params"]["remote_blocks"] == 4096 // 16
    assert (
        route["t_sent_prefill_ns"]
        < route["t_done_prefill_ns"]
        <= route["t_sent_decode_ns"]
        < route["t_first_decode_ns"]
    )
    assert (
        route["prefill_metrics_after"]["prompt_tokens_total"] > route["prefill_metrics_before"]["prompt_tokens_total"]
    )


def test_in_virtual_time_the_pair_gives_the_profiles_transfer_exactly(tmp_path: Path) -> None:
    settings = ProtocolSettings()

    async def main():  # type: ignore[no-untyped-def]
        driver = PdDriver(SimDriver.create(chunk_size=8192, kv_role="prefill"),
                          SimDriver.create(chunk_size=8192, kv_role="decode"))
        try:
            await warm_prefix(driver, settings)
            return [await measure_point(driver, PointSpec(8192, 4, p), settings, ResultsStore(tmp_path), reps=2)
                    for p in (2048, 32768)]
        finally:
            await driver.aclose()

    short, long_ = run_virtual(main())
    for record, p in ((short, 2048), (long_, 32768)):
        assert record.interference.kv_transfer_ms == pytest.approx(
            PROFILE.kv_transfer.seconds(p, PROFILE.model.kv_bytes_per_token) * 1e3, abs=1e-3)
        assert record.interference.num_chunks_actual in (0, 1)
    # the request pays more for a longer prompt (prefill elsewhere + transfer), the decodes barely notice
    assert long_.interference.offload_ttft_ms > short.interference.offload_ttft_ms + 500
    assert long_.derived.aggregate_interference_ms < 0.2 * long_.interference.offload_prefill_ms * 4


def test_the_routing_driver_cancels_a_failed_windows_streams_on_the_decode_instance() -> None:
    """Issue 31: a failed window's streams must end before its re-run; the pair's driver can cancel
    them (`driver.Cancelling`), and the decode instance aborts them, as for a client gone away."""
    from pdexporter.measure.driver import Cancelling
    from pdexporter.measure.protocol import end_streams, start_probes

    settings = ProtocolSettings()

    async def main() -> tuple[int, int, list[str | None]]:
        driver = PdDriver(SimDriver.create(chunk_size=8192, kv_role="prefill"),
                          SimDriver.create(chunk_size=8192, kv_role="decode"))
        try:
            assert isinstance(driver, Cancelling)
            probes = start_probes(driver, 3, settings)
            await driver.progress.wait_until(lambda: all(p.n_tokens >= 5 for p in probes), 60)
            engine = driver.decode.engine  # type: ignore[attr-defined]
            before = engine.scheduler.num_running
            await end_streams(driver, probes, 60)
            await asyncio.sleep(0)
            return before, engine.scheduler.num_running, [p.finish_reason for p in probes]
        finally:
            await driver.aclose()

    before, after, reasons = run_virtual(main())
    assert (before, after) == (3, 0) and reasons == ["abort"] * 3
