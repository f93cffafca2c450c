"""The embedded engine's KV roles on a manual clock: DecodeBench's 1-token admission with its fill,
the decode instance waiting for a modelled transfer, the prefill instance's kv_transfer_params,
NixlConnector's metrics, and the step-time model's admission costs (all MODELLED)."""

from __future__ import annotations

import pytest
from prometheus_client import generate_latest

from pdexporter.client.metrics import metric_deltas, parse_exposition
from pdexporter.engines import adapter, identify
from pdexporter.sim.engine import NO_LOOP_COSTS, EngineConfig, EngineCore, ManualClock
from pdexporter.sim.kvconnector import KvParamsError, check_decode_params
from pdexporter.sim.profile import load_profile
from pdexporter.sim.steptime import StepComposition, StepTimeModel, landing_factor
from pdexporter.sim.vllm_metrics import VllmMetrics

PREFIX = tuple(range(2000, 2000 + 4096))
STEP = 0.010
REMOTE = {"do_remote_prefill": True, "do_remote_decode": False, "remote_block_ids": [1, 2], "remote_engine_id": "e",
          "remote_request_id": "r", "remote_host": "localhost", "remote_port": 5600, "tp_size": 1}


def cold(n: int, base: int = 50_000) -> tuple[int, ...]:
    return tuple(base + (i * 7919) % 90_000 for i in range(n))


@pytest.fixture
def profile():
    return load_profile("h200-qwen3-coder-30b-a3b")


def make(profile, role, b: int = 8192, log=None, step=lambda comp: STEP):
    clock = ManualClock()
    metrics = VllmMetrics(profile.model.name)
    comps: list[StepComposition] = []

    def timed(comp: StepComposition) -> float:
        comps.append(comp)
        return step(comp)

    engine = EngineCore(profile, clock, config=EngineConfig.from_profile(profile, max_num_batched_tokens=b),
                        step_model=timed, loop_costs=NO_LOOP_COSTS, metrics=metrics, log=log, kv_role=role)
    return clock, engine, metrics, comps


def run_decodes_then(clock, engine, prompt, params=None, d=4):
    out: dict[str, list] = {}

    def sink(rid):
        return lambda o, t: out.setdefault(rid, []).append((t, o))

    for i in range(d):
        engine.add_request(f"d{i}", PREFIX + cold(16, 100 * i), 500, sink(f"d{i}"))
    clock.advance_to(0.3)
    t0 = clock.now()
    engine.add_request("p", prompt, 1, sink("p"), kv_transfer_params=params)
    clock.run(until=lambda: "p" in out)
    return out, t0


def test_decode_bench_admits_a_new_request_in_one_step_of_one_token_with_its_kv_filled(profile):
    lines: list[str] = []
    clock, engine, _, comps = make(profile, "decode-bench", log=lines.append)
    out, t0 = run_decodes_then(clock, engine, cold(32768))
    step = [s for s in engine.history if s.context_tokens > 0][-1]
    assert (step.context_requests, step.context_tokens, step.generation_requests) == (1, 1, 4)
    assert "1 context requests, 1 context tokens, 4 generation requests" in lines[-1] or any(
        "1 context requests, 1 context tokens, 4 generation requests" in line for line in lines)
    # the step that admitted it carried the fill of its other 32767 tokens
    filled = [c for c in comps if c.kv_fill_tokens]
    assert filled[-1].kv_fill_tokens == 32767 and filled[-1].num_tokens == 5
    # its token comes out of the first step it is scheduled in (async: at most N+2), not after 5 chunks
    assert out["p"][0][0] - t0 <= 3 * STEP + 1e-9


def test_decode_bench_fills_only_what_the_prefix_cache_lacks(profile):
    clock, engine, _, comps = make(profile, "decode-bench")
    engine.add_request("warm", PREFIX, 1)
    clock.run()
    engine.add_request("probe", PREFIX + cold(16), 4)
    clock.run()
    # 4096 + 16 tokens, the 4096 of the warm prefix cached: 15 filled, the last one computed
    assert comps[-4].kv_fill_tokens == 15 and comps[-4].num_tokens == 1


def test_the_decode_instance_waits_for_the_modelled_transfer_then_runs_one_token(profile):
    clock, engine, metrics, comps = make(profile, "decode")
    before = parse_exposition(generate_latest(metrics.registry).decode(), adapter("pdexporter-sim"))
    out, t0 = run_decodes_then(clock, engine, cold(32768), REMOTE)
    transfer = profile.kv_transfer.seconds(32768, profile.model.kv_bytes_per_token)
    assert transfer == pytest.approx(0.005 + 32768 * 98304 / (450e9 * 0.5))
    # no step while the bytes move; the decodes went on (they got tokens meanwhile)
    ttft = out["p"][0][0] - t0
    assert transfer + STEP <= ttft <= transfer + 4 * STEP
    assert sum(1 for t, _ in out["d0"] if t0 < t < t0 + transfer) >= int(transfer / STEP) - 1
    step = [s for s in engine.history if s.context_tokens > 0][-1]
    assert (step.context_requests, step.context_tokens) == (1, 1)
    assert not any(c.kv_fill_tokens for c in comps)  # the KV arrived by transfer, no fill in a step
    after = parse_exposition(generate_latest(metrics.registry).decode(), adapter("pdexporter-sim"))
    deltas = metric_deltas(before, after)
    assert deltas["kv_transfer_time_seconds_sum_delta"] == pytest.approx(transfer)
    assert deltas["kv_transfer_bytes_sum_delta"] == 32768 * 98304
    assert deltas["kv_transfer_time_seconds_count_delta"] == 1


def test_a_decode_instance_serves_plain_requests_as_a_plain_engine(profile):
    clock, engine, _, _ = make(profile, "decode")
    _out, _ = run_decodes_then(clock, engine, cold(16384))
    chunks = [s.context_tokens for s in engine.history if s.context_tokens > 0]
    assert chunks[-3:] == [8188, 8188, 8]  # no kv_transfer_params: computed here, chunked as vLLM does


def test_the_prefill_instance_answers_where_the_kv_is(profile):
    clock, engine, _, _ = make(profile, "prefill")
    done = []
    engine.add_request("p", cold(4096), 1, lambda o, t: done.append(o), kv_transfer_params={"do_remote_decode": True})
    engine.add_request("q", cold(64, 7), 1, lambda o, t: done.append(o))
    clock.run()
    by_id = {o.request_id: o for o in done}
    params = by_id["p"].kv_transfer_params
    assert params["do_remote_prefill"] is True and params["do_remote_decode"] is False
    assert len(params["remote_block_ids"]) == 4096 // 16 and params["remote_num_tokens"] == 4096
    assert {"remote_engine_id", "remote_request_id", "remote_host", "remote_port", "tp_size"} <= set(params)
    assert by_id["q"].kv_transfer_params is None  # not asked to: a normal request


def test_decode_params_must_name_the_remote_blocks() -> None:
    check_decode_params(REMOTE)
    check_decode_params({"do_remote_decode": True})
    with pytest.raises(KvParamsError, match="remote_block_ids, remote_engine_id"):
        check_decode_params({"do_remote_prefill": True, "remote_request_id": "r", "remote_host": "h",
                             "remote_port": 1})


def test_the_step_time_model_prices_the_fill_and_the_landing(profile):
    model = StepTimeModel(profile)
    plain = StepComposition.of([(1, 4096)] * 4 + [(1, 32767)])
    filled = StepComposition.of([(1, 4096)] * 4 + [(1, 32767)], kv_fill_tokens=32767)
    extra = model.gpu_s(filled) - model.gpu_s(plain)
    expected = 32767 * profile.model.kv_bytes_per_token / (profile.gpu.hbm_bandwidth_tb_s * 1e12 * 0.5)
    assert extra == pytest.approx(expected) and model.breakdown(filled).kv_fill_s == pytest.approx(expected)
    assert landing_factor(profile) == pytest.approx(1 + 0.5 * 225e9 / 4.8e12)
    stiff = profile.model_copy(
        update={"step_time": profile.step_time.model_copy(update={"kv_landing_contention": 0.0})}
    )
    assert landing_factor(stiff) == 1.0


def test_engines_are_recognised_by_their_setup() -> None:
    assert identify({"version": "0.22.0+pdexporter.sim", "modelled": True, "kv_role": "decode"}).name == \
        "pdexporter-sim-pd-decode"
    assert identify({"version": "0.22.0+pdexporter.sim", "modelled": True, "kv_role": None}).name == "pdexporter-sim"
    assert identify({"version": "0.22.0"}).name == "vllm"
    bench = ["vllm", "serve", "m", "--kv-transfer-config",
             '{"kv_connector":"DecodeBenchConnector","kv_role":"kv_both"}']
    setup_for_command = adapter("vllm").for_command
    assert setup_for_command(bench) == "vllm-decode-bench"
    nixl = ["vllm", "serve", "m", '--kv-transfer-config={"kv_connector":"NixlConnector","kv_role":"kv_both"}']
    assert setup_for_command(nixl, role="decode") == "vllm-pd-decode"
    assert setup_for_command(nixl, role="prefill") == "vllm-pd-prefill"
    assert setup_for_command(nixl) == "vllm"  # one engine with NIXL but no pair: nothing offloaded
    assert setup_for_command(["vllm", "serve", "m"]) == "vllm"
