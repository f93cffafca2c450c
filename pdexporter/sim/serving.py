"""`pdexporter sim serve` as one call: the options checked (each problem one line naming its flag),
the profile read, the embedded engine served in real time until SIGTERM/SIGINT, its log lines
handed to `log`."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

from pdexporter._internal.atomic import atomic_write_json
from pdexporter._internal.gate import wait_gate
from pdexporter._internal.writable import check_writable
from pdexporter.errors import ConfigError
from pdexporter.sim.episodes import DWELL_S
from pdexporter.sim.kvconnector import KV_ROLES
from pdexporter.sim.profile import load_profile
from pdexporter.sim.server import ServeOptions, precise_event_loop, run_server

__all__ = [
    "HOST_SPEEDS", "SGLANG", "VLLM", "serve_embedded",
]


VLLM, SGLANG = "vllm", "sglang"  # the engines `sim serve --engine` imitates
HOST_SPEEDS = ("nominal", "slow", "switching")


def serve_embedded(*, log: Callable[[str], None], default_profile: str, profile: str | None = None,
                   chunk_size: int | None = None, engine: str = VLLM, enable_mixed_chunk: bool = False,
                   decode_log_interval: int = 40, enable_metrics: bool = False, max_num_seqs: int | None = None,
                   long_prefill_token_threshold: int | None = None, kv_role: str = "none", host: str = "127.0.0.1",
                   port: int = 8000, ready_file: Path | None = None, otlp_traces_endpoint: str | None = None,
                   host_speed: str = "nominal") -> None:
    """Serve vLLM's (or SGLang's) API from the embedded engine (the options: `sim serve --help`)."""
    if kv_role not in ("none", *KV_ROLES):
        raise ConfigError(f"--kv-role {kv_role!r}: expected none, {', '.join(KV_ROLES)}")
    if host_speed not in HOST_SPEEDS:
        raise ConfigError(f"--host-speed {host_speed!r}: expected {', '.join(HOST_SPEEDS)}")
    if engine not in (VLLM, SGLANG):
        raise ConfigError(f"--engine {engine!r}: the embedded engine imitates vllm or sglang")
    if engine == VLLM and enable_mixed_chunk:
        raise ConfigError("--enable-mixed-chunk: an SGLang flag; add --engine sglang")
    if engine != VLLM and kv_role != "none":
        raise ConfigError(f"--kv-role {kv_role}: the embedded engine models P/D roles imitating vllm only")
    if ready_file is not None:
        check_writable(ready_file, "--ready-file", directory=False)
    imitates = "sglang-mixed" if enable_mixed_chunk else engine
    if profile is None:
        from pdexporter.engines import adapter

        profile = adapter(imitates).sim_profile or default_profile
    prof = load_profile(profile)
    if host_speed == "slow":
        prof = prof.on_slow_host()
    if host_speed == "switching" and not (0 < prof.host.slow_fraction < 1 and prof.host.slow_factor > 1):
        raise ConfigError(f"--host-speed switching: profile {prof.name} has no slow-host episodes to switch to "
                          f"(host.slow_fraction {prof.host.slow_fraction:g}, slow_factor {prof.host.slow_factor:g})")
    options = ServeOptions(chunk_size, max_num_seqs, long_prefill_token_threshold, host, port,
                           None if kv_role == "none" else kv_role,
                           otlp_traces_endpoint=otlp_traces_endpoint, imitates=imitates,
                           decode_log_interval=decode_log_interval if engine != VLLM else 1,
                           enable_metrics=enable_metrics or engine == VLLM, host_episodes=host_speed == "switching")

    def ready(info: dict[str, object]) -> None:
        role = f", KV role {kv_role}" if kv_role != "none" else ""
        if host_speed == "slow":
            role += f", slow host: CPU x {load_profile(profile).host.slow_factor:.2f}"
        elif host_speed == "switching":
            role += (f", slow-host episodes: CPU x {prof.host.slow_factor:.2f} {prof.host.slow_fraction:.0%} of the "
                     f"time, ~{DWELL_S:g} s each")
        role += f", imitating {imitates}" if imitates != VLLM else ""
        log(f"INFO pdexporter embedded engine (MODELLED, profile {prof.name}, calibration {prof.calibration}, "
            f"max_num_batched_tokens {info['max_num_batched_tokens']}{role}) serving {info['model']} on {info['url']}")
        log("INFO Asynchronous scheduling is enabled." if prof.engine.async_scheduling else
            "INFO Asynchronous scheduling is disabled.")
        if ready_file is not None:
            atomic_write_json(ready_file, info)

    # Started early behind a launcher's start gate (launch.overlap): held here, where vLLM would
    # touch the GPU, until the engine before it has stopped.
    wait_gate("the embedded engine's start")
    with asyncio.Runner(loop_factory=precise_event_loop) as runner:
        runner.run(run_server(prof, options, on_ready=ready, log=log))
    log("INFO embedded engine stopped")
