"""`pdexporter run` as a job: its options checked into an `ExporterConfig` before anything starts
(`parse_run_options`, each problem one line naming its option), the secrets it needs read
(`bearer_token`, `load_live_decision`), and the exporter served on its engine until SIGTERM/SIGINT
(`serve`: the first signal finishes the window in flight, a second one abandons it)."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pdexporter._internal.redact import redact_url
from pdexporter._internal.secretfile import read_secret_file, secret_text
from pdexporter._internal.urls import check_http_url
from pdexporter.client.client import read_timeout_seconds
from pdexporter.engines import UNIDENTIFIED, adapter
from pdexporter.errors import ConfigError
from pdexporter.exporter.config import (
    DEFAULT_CHUNK_SIZE,
    DEFAULT_INJECT_EVERY_S,
    DEFAULT_LISTEN,
    DEFAULT_PREFILL_TOKENS,
    ExporterConfig,
    build_config,
    parse_duration,
)
from pdexporter.exporter.receiver import DEFAULT_TRACES_PORT
from pdexporter.exporter.server import parse_listen
from pdexporter.exporter.startup import parse_engine_wait
from pdexporter.launch.choose import claimed_engine, command_of, imitated_option, make_launcher
from pdexporter.measure.protocol import protocol_settings
from pdexporter.measure.sim_driver import DEFAULT_PROFILE

if TYPE_CHECKING:  # imported where the exporter starts: its passive path brings pandas (~0.45 s of CPU), which
    # `run --help` and a rejected option need not pay for
    from pdexporter.exporter.runner import Runner

__all__ = [
    "METRICS_TOKEN_ENV", "TRACES_TOKEN_ENV", "RunOptions", "bearer_token", "load_live_decision", "parse_run_options",
    "run_config", "serve",
]


METRICS_TOKEN_ENV = "PDEXPORTER_METRICS_TOKEN"
TRACES_TOKEN_ENV = "PDEXPORTER_TRACES_TOKEN"
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)  # each: the window in flight, then stop


def load_live_decision(path: Path | None) -> dict[str, Any] | None:
    """`--decision FILE`: a two-arm decision.json, checked now (one line naming the file and why)."""
    if path is None:
        return None
    from pdexporter.analysis.live_thresholds import decision_problem
    from pdexporter.analysis.verdicts import load_decision

    doc = load_decision(path, flag="--decision")
    problem = decision_problem(doc)
    if problem:
        raise ConfigError(f"--decision {path}: {problem}")
    return doc


def bearer_token(path: Path | None, flag: str, env: str) -> str | None:
    """A token of the exporter's own endpoints: from the file, else the environment variable."""
    if path is not None:
        return read_secret_file(path, flag)
    value = os.environ.get(env, "")
    return secret_text(value, f"${env}") if value.strip() else None


@dataclass(frozen=True)
class RunOptions:
    """`pdexporter run`'s options as given, with their defaults: declared here once (the command
    line adds each one's flags and help, and takes its default from here)."""

    decode_batch_size: int = 4
    target: str | None = None
    engine: str | None = None
    engine_command: str | None = None
    chunk_size: int | None = None
    inject_every: str | None = None
    new_prefill_tokens: int = DEFAULT_PREFILL_TOKENS
    listen: str = DEFAULT_LISTEN
    out: Path | None = None
    model: str | None = None
    profile: str = DEFAULT_PROFILE
    duration: str | None = None
    scrape_interval: str = "5s"
    decode_context_tokens: int = 4096
    decode_output_tokens: int = 256
    passive: bool = False
    attribution_wait: str = "30s"
    engine_wait: str = "forever"
    read_timeout: str | None = None
    traces_listen: str | None = None
    traces_max_rate: float = 1000.0
    tls_cert_file: Path | None = None
    tls_key_file: Path | None = None
    decision: Path | None = None
    threshold_every: str = "2m"


def parse_run_options(**options: Any) -> ExporterConfig:
    """`run_config` of the options by name (`RunOptions`' fields; an unknown name is a TypeError)."""
    return run_config(RunOptions(**options))


def run_config(o: RunOptions) -> ExporterConfig:
    """Every option checked before anything starts; each problem is one line naming the option."""
    chunk_size = o.chunk_size
    if o.decode_batch_size < 1:
        raise ConfigError(f"--decode-batch-size {o.decode_batch_size}: must be >= 1")
    if o.new_prefill_tokens < 1:
        raise ConfigError(f"--new-prefill-tokens {o.new_prefill_tokens}: must be >= 1")
    if o.target is not None:
        check_http_url(o.target, "--target")
    claimed = claimed_engine(o.target, o.engine)
    words, said = command_of(o.target, o.engine_command, chunk_size, claimed)
    if chunk_size is None and said is not None:
        chunk_size = said[1]  # the chunk size its command line starts it with
    chunk_size_source = "given"
    if chunk_size is None:
        # vLLM does not publish max_num_batched_tokens; against an engine someone else runs we
        # assume the engine's default (vLLM's for its OpenAI server on a >= 70 GB GPU), and every
        # window checks it against the probes' cadence (the runner says which sizes fit when it
        # does not). An engine that publishes its own (SGLang) replaces it once it answers.
        chunk_size = (adapter(claimed or UNIDENTIFIED).default_chunk_size if o.target is not None
                      else DEFAULT_CHUNK_SIZE)
        chunk_size_source = "assumed" if o.target is not None else "given"
    if o.passive and o.inject_every is not None and o.inject_every.strip().lower() not in ("off", "0", "none"):
        raise ConfigError(f"--inject-every {o.inject_every}: --passive injects nothing; leave --inject-every out "
                          "(or set it to off)")
    if o.inject_every is None:
        inject_every_s: float | None = DEFAULT_INJECT_EVERY_S if o.target is None and not o.passive else None
    elif o.inject_every.strip().lower() in ("off", "0", "none"):
        inject_every_s = None
    else:
        inject_every_s = parse_duration(o.inject_every, "--inject-every")
        if inject_every_s <= 0:
            raise ConfigError(f"--inject-every {o.inject_every!r}: must be > 0 (or 'off')")
    host, port = parse_listen(o.listen)
    traces_receiver: bool | None = None  # None: with --passive only, which is what uses the spans
    traces_host: str | None = None
    traces_port = DEFAULT_TRACES_PORT
    if o.traces_listen is not None and o.traces_listen.strip().lower() in ("off", "none", ""):
        traces_receiver = False
    elif o.traces_listen is not None:
        traces_receiver = True
        traces_host, traces_port = parse_listen(o.traces_listen, "--traces-listen")
        if traces_port == port and traces_port != 0 and traces_host == host:
            raise ConfigError(
                f"--traces-listen {o.traces_listen}: the same address as --listen; give it a port of its own"
            )
    if (o.tls_cert_file is None) != (o.tls_key_file is None):
        raise ConfigError("--tls-cert-file and --tls-key-file go together")
    # one line naming the option that is wrong (issue 24: --decode-context-tokens -1 was blamed on
    # --decode-output-tokens)
    protocol = protocol_settings(decode_context_tokens=o.decode_context_tokens,
                                 decode_output_tokens=o.decode_output_tokens)
    read_timeout_s = None if o.read_timeout is None else read_timeout_seconds(o.read_timeout)
    duration_s = None if o.duration is None else parse_duration(o.duration, "--duration")
    if duration_s is not None and duration_s <= 0:
        raise ConfigError(f"--duration {o.duration!r}: must be > 0")
    return build_config(
        probe_streams=o.decode_batch_size,
        chunk_size=chunk_size,
        chunk_size_source=chunk_size_source,
        target=o.target,
        inject_every_s=inject_every_s,
        prefill_tokens=o.new_prefill_tokens,
        listen_host=host,
        listen_port=port,
        out=o.out,
        model=o.model,
        profile=o.profile,
        duration_s=duration_s,
        scrape_interval_s=parse_duration(o.scrape_interval, "--scrape-interval"),
        protocol=protocol.with_read_timeout(read_timeout_s),
        passive=o.passive,
        attribution_wait_s=parse_duration(o.attribution_wait, "--attribution-wait"),
        engine_wait_s=parse_engine_wait(o.engine_wait),
        read_timeout_s=read_timeout_s,
        traces_receiver=traces_receiver,
        traces_listen_host=traces_host,
        traces_listen_port=traces_port,
        traces_max_rate=o.traces_max_rate,
        tls_cert_file=o.tls_cert_file,
        tls_key_file=o.tls_key_file,
        engine=claimed,
        engine_command=words,
        decision_file=o.decision,
        threshold_every_s=parse_duration(o.threshold_every, "--threshold-every"),
    )


async def serve(config: ExporterConfig, *, log: Callable[[str], None], api_key: str | None = None,
                metrics_token: str | None = None, traces_token: str | None = None,
                decision: dict[str, Any] | None = None,
                progress: Callable[[Runner, float], Coroutine[Any, Any, None]] | None = None) -> None:
    """Run the exporter on the engine `config` names until SIGTERM/SIGINT (or --duration);
    `progress`, with --duration, follows the runner meanwhile."""
    from pdexporter.exporter.runner import Runner

    launcher = make_launcher(
        config.target,
        profile=config.profile,
        engine=imitated_option(config.target, config.engine),
        chunk_size=None if config.target and config.chunk_size_source != "given" else config.chunk_size,
        engine_command=config.engine_command,
    )
    runner = Runner(config, launcher, api_key=api_key, metrics_token=metrics_token, traces_token=traces_token,
                    log=log, decision=decision)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    signals_seen = 0

    def on_signal(signum: int) -> None:
        nonlocal signals_seen
        signals_seen += 1
        if signals_seen == 1:
            log(f"{signal.Signals(signum).name}: finishing the window in flight, then stopping")
            stop.set()
        else:  # a second signal: do not wait for the window
            runner.abort_window()

    for sig in STOP_SIGNALS:  # SIGHUP too: a closed terminal or a supervisor's hang-up stops it cleanly
        loop.add_signal_handler(sig, on_signal, sig)
    mode = "embedded engine (modelled)" if config.target is None else redact_url(config.target)
    injection = (
        f"a {config.prefill_tokens}-token prefill every {config.inject_every_s:g} s"
        if config.inject_every_s
        else "passive mode: the production prefills the probes see"
        if config.passive else "no prefill injection"
    )
    log(f"pdexporter run: {config.probe_streams} probe streams on {mode}, {injection}")
    bar = asyncio.create_task(progress(runner, config.duration_s)) if config.duration_s and progress else None
    try:
        await runner.run(stop)
    finally:
        if bar is not None:
            bar.cancel()
            await asyncio.gather(bar, return_exceptions=True)
        for sig in STOP_SIGNALS:
            loop.remove_signal_handler(sig)
    log(f"stopped after {runner.windows_seen} window(s)")
    sys.stdout.flush()
