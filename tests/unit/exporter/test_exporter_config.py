"""`pdexporter run` options: durations, validation, one-line errors naming the option."""

from __future__ import annotations

import pytest

from pdexporter.cli.run import parse_run_options
from pdexporter.errors import ConfigError
from pdexporter.exporter.config import DEFAULT_PORT, build_config, parse_duration


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("500ms", 0.5), ("30s", 30.0), ("5m", 300.0), ("1h", 3600.0), ("2.5s", 2.5), ("7", 7.0), (" 10 s ", 10.0),
     ("1h30m", 5400.0), ("1d", 86400.0)],
)
def test_durations(text: str, seconds: float) -> None:
    assert parse_duration(text, "--x") == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["", "ten", "5 minutes", "-1s", "1x", "s", "nan", "inf"])
def test_bad_durations_name_the_option(text: str) -> None:
    with pytest.raises(ConfigError, match=r"^--inject-every .*expected a duration"):
        parse_duration(text, "--inject-every")


def _options(**overrides: object) -> dict[str, object]:
    options: dict[str, object] = dict(
        decode_batch_size=4, target=None, chunk_size=None, inject_every=None, new_prefill_tokens=8192,
        listen="0.0.0.0:18742", out=None, model=None, profile="h200-qwen3-coder-30b-a3b", duration=None,
        scrape_interval="5s", decode_context_tokens=4096, decode_output_tokens=256,
    )
    options.update(overrides)
    return options


def test_defaults_embedded_engine_injects_every_30s() -> None:
    config = parse_run_options(**_options())  # type: ignore[arg-type]
    assert config.chunk_size == 8192
    assert config.inject_every_s == 30.0
    assert config.listen_port == DEFAULT_PORT == 18742
    assert config.listen_host == "0.0.0.0"
    assert config.engine == "pdexporter-sim"  # the embedded engine, imitating vLLM unless --engine says


def test_external_target_injection_is_opt_in_and_its_chunk_size_assumed_when_not_given() -> None:
    assumed = parse_run_options(**_options(target="http://vllm:8000"))  # type: ignore[arg-type]
    assert assumed.chunk_size == 8192 and assumed.chunk_size_source == "assumed"  # vLLM's default
    assert assumed.engine is None  # the engine will say who it is
    config = parse_run_options(**_options(target="http://vllm:8000", chunk_size=2048))  # type: ignore[arg-type]
    assert config.chunk_size_source == "given"
    assert config.inject_every_s is None and not config.injecting


def test_the_engine_command_gives_the_chunk_size_and_travels_redacted() -> None:
    """`run --target URL --engine-command '...'`: its chunk flag is the chunk size, given (not assumed); the words
    reach the launcher, and so the records, with the secret hidden; without --target it is one line."""
    command = "vllm serve m --max-num-batched-tokens 4096 --api-key sk-1"
    config = parse_run_options(**_options(target="http://vllm:8000", engine_command=command))  # type: ignore[arg-type]
    assert (config.chunk_size, config.chunk_size_source) == (4096, "given")
    assert config.engine_command == ("vllm", "serve", "m", "--max-num-batched-tokens", "4096", "--api-key", "***")
    with pytest.raises(ConfigError, match="^--engine-command: only with --target"):
        parse_run_options(**_options(engine_command=command))  # type: ignore[arg-type]


def test_advice_names_the_chunk_sizes_the_slow_steps_fit() -> None:
    from pdexporter.engines import adapter, chunk_size_advice, infer_chunk_size

    # 32K-token prefills beside 4 decodes on an engine at B=2048 slow ~17-19 steps (17 chunks + stalls)
    windows = [(32768, 4, 18), (32768, 4, 19), (8192, 4, 5)]
    vllm = adapter("vllm")
    best, fits = infer_chunk_size(windows, vllm.candidate_chunk_sizes, vllm.chunk_schedule, 8192)
    assert best == 2048 and fits == (2048,)
    line = chunk_size_advice(windows, 8192, "assumed", "vllm")
    assert "do not fit chunk size 8192 (assumed)" in line and "likely 2048" in line and "\n" not in line
    # the size in use is never offered back as a fit (the runtime audit: "do not fit 2048 ...; sizes that fit: 2048")
    line = chunk_size_advice([(8192, 4, 5)], 2048, "given", "vllm")
    assert "other sizes that fit:" in line and ": 2048" not in line and "likely 2048" not in line, line
    config = parse_run_options(**_options(target="http://vllm:8000", chunk_size=2048, inject_every="45s"))  # type: ignore[arg-type]
    assert config.inject_every_s == 45.0


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"decode_batch_size": 0}, r"^--decode-batch-size 0: must be >= 1$"),
        ({"new_prefill_tokens": 0}, r"^--new-prefill-tokens 0: must be >= 1$"),
        ({"listen": "nowhere"}, r"^--listen 'nowhere': expected HOST:PORT$"),
        ({"listen": "0.0.0.0:70000"}, r"^--listen '0.0.0.0:70000': port out of range$"),
        ({"target": "vllm:8000", "chunk_size": 8192}, r"^--target 'vllm:8000': expected an http"),
        ({"inject_every": "soon"}, r"^--inject-every 'soon'"),
        ({"duration": "0s"}, r"^--duration '0s': must be > 0$"),
        ({"decode_batch_size": 1024, "chunk_size": 1024}, r"--decode-batch-size 1024 with --chunk-size 1024"),
        # Issue 13: bounds (`_internal.bounds`) named with the option
        ({"decode_batch_size": 100_000}, r"^--decode-batch-size 100000: must be <= 1024$"),
        ({"new_prefill_tokens": 99999999999999999999},
         r"^--new-prefill-tokens 99999999999999999999: must be <= 10000000$"),
        ({"engine_wait": "soon"}, r"^--engine-wait 'soon'"),
        ({"engine_wait": "0s"}, r"^--engine-wait '0s': must be 'forever' or a duration > 0"),
        ({"read_timeout": "0"}, r"^--read-timeout '0': must be > 0"),
        ({"new_prefill_tokens": 1_000_000, "chunk_size": 512}, r"^--new-prefill-tokens .*raise --decode-output-tokens"),
        ({"decode_output_tokens": 40}, r"^--decode-output-tokens 40: "),
        # issue 24: was blamed on --decode-output-tokens
        ({"decode_context_tokens": -1}, r"^--decode-context-tokens -1: must be >= 1$"),
        ({"traces_listen": "0.0.0.0:18742"}, r"^--traces-listen 0.0.0.0:18742: the same address as --listen"),
        ({"traces_listen": "x:y"}, r"^--traces-listen 'x:y': expected HOST:PORT$"),
        ({"tls_cert_file": "cert.pem"}, r"^--tls-cert-file and --tls-key-file go together$"),
    ],
)
def test_bad_options_are_one_line(overrides: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=message) as info:
        parse_run_options(**_options(**overrides))  # type: ignore[arg-type]
    assert "\n" not in str(info.value)


def test_the_trace_receiver_is_served_only_where_something_uses_it() -> None:
    """Issue 24: every `run` served POST /v1/traces on 0.0.0.0. Now: off unless --passive (or
    --traces-listen), on a port of its own, so a firewall can open it to the engine alone."""
    active = parse_run_options(**_options(target="http://vllm:8000", inject_every="30s"))  # type: ignore[arg-type]
    assert not active.serves_traces
    passive = parse_run_options(**_options(passive=True, target="http://vllm:8000"))  # type: ignore[arg-type]
    assert passive.serves_traces and (passive.traces_host, passive.traces_listen_port) == ("0.0.0.0", 18743)
    asked = parse_run_options(**_options(traces_listen="127.0.0.1:4318"))  # type: ignore[arg-type]
    assert asked.serves_traces and (asked.traces_host, asked.traces_listen_port) == ("127.0.0.1", 4318)
    off = parse_run_options(**_options(passive=True, target="http://vllm:8000", traces_listen="off"))  # type: ignore[arg-type]
    assert off.passive and not off.serves_traces


def test_reserve_covers_window_and_recovery() -> None:
    config = build_config(probe_streams=4, chunk_size=2048, prefill_tokens=32768, inject_every_s=30.0)
    # 17 chunks at B=2048, D=4 (docs/vllm-facts.md): the steady check (8), two steps each at most,
    # 32 recovery intervals and a margin: one window's tokens, as a fast-mode sweep sizes its probes.
    from pdexporter.engines import adapter

    assert len(adapter("vllm").chunk_schedule(32768, 2048, 4)) == 17
    assert config.reserve_tokens == 8 + 17 * 2 + 32 + 8 == config.protocol.window_tokens("vllm", 32768, 2048, 4)
    assert config.reserve_tokens <= config.protocol.decode_output_tokens - config.protocol.inject_at_tokens


def test_passive_injects_nothing_even_on_the_embedded_engine() -> None:
    config = parse_run_options(**_options(passive=True, attribution_wait="45s"))  # type: ignore[arg-type]
    assert config.passive and config.inject_every_s is None and not config.injecting
    assert config.attribution_wait_s == 45.0
    off = parse_run_options(**_options(passive=True, inject_every="off", target="http://vllm:8000"))  # type: ignore[arg-type]
    assert off.passive and not off.injecting


@pytest.mark.parametrize("overrides, message", [
    ({"passive": True, "inject_every": "10s"}, r"^--inject-every 10s: --passive injects nothing"),
    ({"passive": True, "attribution_wait": "soon"}, r"^--attribution-wait 'soon'"),
])
def test_passive_option_errors_are_one_line(overrides: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=message) as info:
        parse_run_options(**_options(**overrides))  # type: ignore[arg-type]
    assert "\n" not in str(info.value)


def test_passive_and_injection_are_refused_together_by_the_schema_too() -> None:
    with pytest.raises(ConfigError, match="--passive injects nothing"):
        build_config(probe_streams=4, chunk_size=8192, passive=True, inject_every_s=30.0)


def test_decision_needs_passive_and_a_two_arm_file(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """`run --passive --decision FILE` (issue 33): one line naming the option and why."""
    import json
    from pathlib import Path

    from pdexporter.cli.run import load_live_decision

    root = Path(__file__).resolve().parents[3] / "results"
    with pytest.raises(ConfigError, match=r"^--decision .*: the live threshold comes from the production prefills "
                                          r"passive mode sees: add --passive"):
        parse_run_options(**_options(decision=root / "h200x2-arms" / "decision.json"))  # type: ignore[arg-type]
    config = parse_run_options(**_options(decision=root / "h200x2-arms" / "decision.json", passive=True,  # type: ignore[arg-type]
                                          threshold_every="30s"))
    assert config.threshold_every_s == 30.0 and config.decision_file is not None
    doc = load_live_decision(config.decision_file)
    assert doc is not None and doc["two_arm"]
    one_arm = root / "h200-vllm0.22-qwen3-coder-30b-a3b" / "decision.json"
    with pytest.raises(ConfigError, match=r"^--decision .*decision.json: has one arm only"):
        load_live_decision(one_arm)
    bad = tmp_path / "d.json"
    bad.write_text(json.dumps({"schema": "other"}))
    with pytest.raises(ConfigError, match=r"^--decision .*d.json: schema 'other'"):
        load_live_decision(bad)
    with pytest.raises(ConfigError, match=r"^--threshold-every 'soon'"):
        parse_run_options(**_options(passive=True, threshold_every="soon"))  # type: ignore[arg-type]
