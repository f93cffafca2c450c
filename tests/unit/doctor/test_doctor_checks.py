"""`pdexporter.doctor.checks`: pure verdicts from what an engine and the endpoints answered."""

from __future__ import annotations

import dataclasses

from pdexporter.doctor.checks import EndpointFacts, EngineFacts, evaluate, failed
from pdexporter.engines import info_labels
from tests.conftest import VLLM_FIXTURES

VLLM_METRICS = (VLLM_FIXTURES / "metrics.txt").read_text()  # a real vLLM 0.22's /metrics

REAL_VLLM = EngineFacts(
    url="http://vllm:8000", embedded=False, health_ms=3.0, engine="vllm", identity={"version": "0.22.0"},
    identity_path="/version",
    models=[{"id": "Qwen/Qwen3-Coder-30B-A3B-Instruct", "max_model_len": 40960}], metrics_text=VLLM_METRICS,
    stream_tokens=4, stream_ms=80.0,
)


def verdicts(facts: EngineFacts, *endpoints: EndpointFacts) -> dict[str, tuple[str, str]]:
    return {c.name: (c.status, c.why) for c in evaluate(facts, endpoints)}


def test_a_real_vllm_without_chunk_size_or_log() -> None:
    v = verdicts(REAL_VLLM)
    assert v["version"] == ("ok", "vllm 0.22.0")
    assert v["model"] == ("ok", "Qwen/Qwen3-Coder-30B-A3B-Instruct")
    assert v["max_model_len"][0] == "ok" and v["max_model_len"][1].startswith("40960 tokens")
    assert v["prefix caching"][0] == "ok"  # enable_prefix_caching="True" in the capture
    assert v["chunk size"][0] == "warn" and "assumed 8192" in v["chunk size"][1]
    assert v["step log"][0] == "warn" and "estimated" in v["step log"][1]
    assert v["CUDA graphs"][0] == "warn" and v["CUDA graphs"][1].startswith("cannot tell")
    assert not failed(evaluate(REAL_VLLM))


def test_cache_config_labels_come_from_the_info_series() -> None:
    labels = info_labels(VLLM_METRICS, "vllm:cache_config_info")
    assert labels is not None and labels["enable_prefix_caching"] == "True" and labels["num_gpu_blocks"] == "44597"
    assert info_labels(VLLM_METRICS, "vllm:no_such_info") is None
    assert info_labels("not an exposition {{{", "vllm:cache_config_info") is None


def test_prefix_caching_off_and_unknown() -> None:
    off = VLLM_METRICS.replace('enable_prefix_caching="True"', 'enable_prefix_caching="False"')
    assert verdicts(dataclasses.replace(REAL_VLLM, metrics_text=off))["prefix caching"][0] == "warn"
    unknown = verdicts(dataclasses.replace(REAL_VLLM, metrics_text=None, metrics_error="answered HTTP 404"))
    assert unknown["prefix caching"] == ("warn", "cannot tell: /metrics answered HTTP 404")


def test_given_chunk_size_and_readable_step_log() -> None:
    v = verdicts(dataclasses.replace(REAL_VLLM, chunk_size=4096, step_log="/var/log/vllm.log", step_log_steps=5,
                                     cuda_graphs=True, cudagraph_max_tokens=8192))
    assert v["chunk size"] == ("ok", "4096 (given with --chunk-size)")
    assert v["step log"][0] == "ok" and "5 steps" in v["step log"][1] and "exact" in v["step log"][1]
    assert v["CUDA graphs"][0] == "ok" and "up to 8192 tokens" in v["CUDA graphs"][1]
    silent = verdicts(dataclasses.replace(REAL_VLLM, step_log="/var/log/vllm.log", step_log_steps=0))
    assert silent["step log"][0] == "warn" and "--enable-logging-iteration-details" in silent["step log"][1]


def test_failures() -> None:
    assert verdicts(dataclasses.replace(REAL_VLLM, models=[]))["model"][0] == "fail"
    wrong = verdicts(dataclasses.replace(REAL_VLLM, model_wanted="other"))
    assert wrong["model"][0] == "fail" and "serves Qwen/Qwen3-Coder-30B-A3B-Instruct" in wrong["model"][1]
    broken = dataclasses.replace(REAL_VLLM, stream_error="stream ended without 'data: [DONE]'")
    assert verdicts(broken)["streaming"][0] == "fail" and failed(evaluate(broken))
    short = verdicts(dataclasses.replace(REAL_VLLM, models=[{"id": "m", "max_model_len": 8192}]))
    assert short["max_model_len"][0] == "warn" and "keep P below 8192" in short["max_model_len"][1]
    dead = evaluate(EngineFacts(url="http://x:1", embedded=False, health_error="cannot connect to http://x:1/health"))
    assert [(c.name, c.status) for c in dead] == [("engine reachable", "fail"), ("engine checks", "skip")]


def test_unknown_engine_and_modelled_engine() -> None:
    odd = verdicts(dataclasses.replace(REAL_VLLM, engine=None, identity=None, identity_path=None,
                                       identity_error="/version: answered HTTP 404"))
    assert odd["version"][0] == "warn" and "vLLM's rules assumed" in odd["version"][1]
    assert "--engine" in odd["version"][1] and "openai-compatible" in odd["version"][1]
    told = verdicts(dataclasses.replace(REAL_VLLM, engine=None, identity=None, identity_path=None,
                                        engine_claimed="sglang", identity_error="/server_info: answered HTTP 404"))
    assert told["version"] == ("warn", "nothing says which engine it is (/server_info: answered HTTP 404): taken as "
                                       "sglang (--engine)")
    sim = verdicts(dataclasses.replace(REAL_VLLM, engine="pdexporter-sim",
                                       identity={"version": "0.22.0+pdexporter.sim", "modelled": True,
                                                 "profile": "h200-qwen3-coder-30b-a3b"}))
    assert sim["version"][0] == "warn" and "MODELLED" in sim["version"][1]


SGLANG_INFO = {"version": "0.5.15.post1", "chunked_prefill_size": 8192, "enable_mixed_chunk": False,
               "decode_log_interval": 40, "enable_metrics": True, "disable_radix_cache": False}


def test_an_sglang_server() -> None:
    """SGLang says who it is and its chunk size at /server_info; its settings are checked for what
    keeps the numbers from being exact (a decode step logged every 40)."""
    facts = dataclasses.replace(REAL_VLLM, engine="sglang", identity=SGLANG_INFO, identity_path="/server_info",
                                metrics_text=None, metrics_error="answered HTTP 404")
    v = verdicts(facts)
    assert v["version"] == ("ok", "sglang 0.5.15.post1 (/server_info)")
    assert v["chunk size"] == ("ok", "8192 (the engine publishes it, /server_info)")
    assert v["engine settings"][0] == "warn" and "--decode-log-interval 1" in v["engine settings"][1]
    assert v["prefix caching"][0] == "ok"  # disable_radix_cache false
    assert v["metrics"][0] == "warn" and "HTTP 404" in v["metrics"][1]
    silent = verdicts(dataclasses.replace(facts, step_log="/tmp/sglang.log", step_log_steps=0))
    assert "--decode-log-interval 1" in silent["step log"][1]
    wrong = verdicts(dataclasses.replace(facts, chunk_size=4096))
    assert wrong["chunk size"][0] == "fail" and "says 8192" in wrong["chunk size"][1]
    good = verdicts(dataclasses.replace(facts, identity={**SGLANG_INFO, "decode_log_interval": 1}))
    assert good["engine settings"][0] == "ok"


def test_endpoints() -> None:
    v = verdicts(REAL_VLLM, EndpointFacts("prometheus", None), EndpointFacts("otlp", "http://c:4318/v1/traces",
                                                                             "--otlp", error="cannot connect"))
    assert v["Prometheus"][0] == "skip"
    assert v["OTLP"] == ("fail", "--otlp: http://c:4318/v1/traces: cannot connect")


def test_tracing_imports_verdicts_name_the_missing_wheel() -> None:
    from pdexporter.doctor.checks import TracingImports, tracing_imports_check, wheel_for

    assert wheel_for("opentelemetry.exporter.otlp.common") == "opentelemetry-exporter-otlp-common"
    assert (
        wheel_for("opentelemetry.exporter.otlp.proto.grpc.trace_exporter") == "opentelemetry-exporter-otlp-proto-grpc"
    )
    assert wheel_for("opentelemetry.exporter.http.transport._requests") == "opentelemetry-exporter-http-transport"
    assert wheel_for("opentelemetry.trace") == "opentelemetry-api" and wheel_for("grpc") == "grpcio"
    assert wheel_for("google.rpc.status_pb2") == "googleapis-common-protos" and wheel_for("yaml") == "yaml"
    # the failure seen on the H200 (docs/vllm-facts.md): the HTTP exporter without its new dependency
    seen = TracingImports("/usr/bin/python3", "--engine-python", failed_import="opentelemetry.exporter.otlp.proto."
                          "http.trace_exporter", missing="opentelemetry.exporter.otlp.common",
                          error="ModuleNotFoundError: No module named 'opentelemetry.exporter.otlp.common'",
                          api_version="1.45.2")
    check = tracing_imports_check(seen)
    assert check.status == "fail" and "missing opentelemetry-exporter-otlp-common" in check.why
    assert "HTTP 500" in check.why and "pip install opentelemetry-exporter-otlp==1.45.2" in check.why
    ok = tracing_imports_check(TracingImports("/usr/bin/python3", ok=True, api_version="1.45.2"))
    assert ok.status == "ok" and "1.45.2" in ok.why
    remote = tracing_imports_check(TracingImports(None, check_command='python3 -c "import x"'))
    assert remote.status == "warn" and 'python3 -c "import x"' in remote.why
    assert tracing_imports_check(TracingImports(None, embedded=True)).status == "ok"
    broken = tracing_imports_check(TracingImports("/nope", "--engine-python", run_error="cannot run it (No such file)"))
    assert broken.status == "fail" and "/nope" in broken.why


def test_trace_arrival_verdicts() -> None:
    from pdexporter.doctor.checks import TraceArrival, trace_arrival_check

    assert trace_arrival_check(TraceArrival(None)).status == "skip"
    ok = trace_arrival_check(TraceArrival("http://h:1/v1/traces", "exporter", delay_s=4.2, waited_s=15))
    assert ok.status == "ok" and "4.2 s" in ok.why and "the running exporter" in ok.why
    late = trace_arrival_check(TraceArrival("http://h:1/v1/traces", "listened", waited_s=15))
    assert late.status == "fail" and "within 15 s" in late.why and "http/protobuf" in late.why
    assert trace_arrival_check(TraceArrival("u", error="the test request failed: x")).status == "fail"


def test_engine_python_of_a_command(tmp_path, monkeypatch) -> None:
    import sys

    from pdexporter.doctor.gather import check_command, engine_python

    assert engine_python(f"{sys.executable} -m vllm.entrypoints.cli.main serve m") == sys.executable
    script = tmp_path / "vllm"
    script.write_text("#!/usr/bin/env python3\n")
    script.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:/usr/bin:/bin")
    assert engine_python("VLLM_X=1 vllm serve m").endswith("python3")
    (tmp_path / "binary").write_bytes(b"\x7fELF")
    (tmp_path / "binary").chmod(0o755)
    assert engine_python("binary --flag") is None and engine_python("no-such-command") is None
    assert check_command("vllm").startswith('python3 -c "import opentelemetry.trace, ')
