"""What `pdexporter run` was asked to do: a pure, validated schema, and the duration syntax.

Everything here is checked before an engine starts or a port is bound, so bad input costs one
line on stderr and nothing else.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from pdexporter._internal.bounds import MAX_DECODE_BATCH, MAX_SECONDS, MAX_TOKENS, MIN_PROBE_STREAMS
from pdexporter._internal.durations import parse_duration  # noqa: F401  (re-exported for the CLI)
from pdexporter._internal.validation import format_option_error
from pdexporter.engines import DEFAULT_CHUNK_SIZE, UNIDENTIFIED, adapter
from pdexporter.errors import ConfigError
from pdexporter.exporter.metrics import DEFAULT_PORT
from pdexporter.exporter.receiver import DEFAULT_TRACES_PORT, ReceiverLimits
from pdexporter.measure.protocol import ProtocolSettings

__all__ = [
    "DEFAULT_CHUNK_SIZE", "DEFAULT_INJECT_EVERY_S", "DEFAULT_LISTEN", "DEFAULT_PREFILL_TOKENS", "ExporterConfig",
    "OPTION_NAMES", "build_config",
]

DEFAULT_LISTEN = f"0.0.0.0:{DEFAULT_PORT}"
# DEFAULT_CHUNK_SIZE (engines'): the embedded engine's default; an external engine's must be given
DEFAULT_PREFILL_TOKENS = 8192
DEFAULT_INJECT_EVERY_S = 30.0  # embedded engine only; against --target injection is opt-in

class ExporterConfig(BaseModel):
    """The exporter's settings. Durations are in seconds; `None` means "off" / "forever"."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    probe_streams: int = Field(ge=MIN_PROBE_STREAMS, le=MAX_DECODE_BATCH)  # D: the decodes it keeps running
    chunk_size: int = Field(ge=1, le=MAX_TOKENS)
    # "given" (--chunk-size, or the embedded engine's own), "published" (the engine said it: SGLang's
    # /server_info), or "assumed": the engine adapter's default for an engine whose chunk size nobody
    # gave and it does not publish (vLLM)
    chunk_size_source: Literal["given", "published", "assumed"] = "given"
    target: str | None = None
    # The engine adapter's name as far as known before the engine starts (--engine; the embedded
    # engine's); None: the engine at --target says who it is (`client.identity`)
    engine: str | None = None
    # how the engine at --target was started, as the operator said (--engine-command), secrets redacted
    engine_command: tuple[str, ...] | None = None
    inject_every_s: float | None = Field(default=None, gt=0, le=MAX_SECONDS)
    prefill_tokens: int = Field(default=DEFAULT_PREFILL_TOKENS, ge=1, le=MAX_TOKENS)
    listen_host: str = "0.0.0.0"
    listen_port: int = Field(default=DEFAULT_PORT, ge=0, le=65535)
    out: Path | None = None
    model: str | None = None
    profile: str = "h200-qwen3-coder-30b-a3b"
    duration_s: float | None = Field(default=None, gt=0, le=MAX_SECONDS)
    scrape_interval_s: float = Field(default=5.0, gt=0, le=MAX_SECONDS)
    # How long to wait for the engine at start-up (`exporter.startup`); None: forever (a sidecar
    # beside a vLLM that loads for 20 minutes must not crash-loop).
    engine_wait_s: float | None = Field(default=None, gt=0, le=MAX_SECONDS)
    # The longest silence allowed inside an engine stream (`--read-timeout`); None: the client's 300 s.
    read_timeout_s: float | None = Field(default=None, gt=0, le=MAX_SECONDS)
    # The baseline of a window: probe intervals of the last `baseline_span_s` of quiet time
    # before the injection; at least `min_baseline_intervals` of them, else the injection waits.
    baseline_span_s: float = Field(default=10.0, gt=0)
    min_baseline_intervals: int = Field(default=32, ge=1)
    protocol: ProtocolSettings = ProtocolSettings()
    # Give up on an injection whose probes never line up (see `reserve_tokens`).
    ready_timeout_s: float = Field(default=60.0, gt=0)
    drain_timeout_s: float = Field(default=30.0, gt=0)  # SIGTERM: longest wait for the window in flight
    switch_interval_s: float = Field(default=0.0005, gt=0)  # sys.setswitchinterval, see docs/exporter.md
    # "kernel-rx": the kernel's receive stamp of the segment (SO_TIMESTAMPNS; engine.kstamp), with
    # the wake-up stamp where the kernel or https refuses it; "wakeup": when the probe loop's
    # selector returned (probes.StampingSelector); "read": when the reading task resumed.
    arrival_stamp: Literal["kernel-rx", "wakeup", "read"] = "kernel-rx"
    # Passive mode (`--passive`): no injection; windows come from the production prefills the
    # probes see (exporter.passive). A run's attribution waits at most this long for the engine's
    # request traces, which arrive when a request finishes.
    passive: bool = False
    attribution_wait_s: float = Field(default=30.0, gt=0)
    # With a two-arm decision.json (`--decision`): the router thresholds, live, refreshed this often
    # (`--threshold-every`; exporter.passive_live). The file is read by the CLI, not here.
    decision_file: Path | None = None
    threshold_every_s: float = Field(default=120.0, gt=0, le=MAX_SECONDS)
    # The OTLP trace receiver (`exporter.receiver`), on a port of its own (`--traces-listen`):
    # served when `traces_receiver` says so, by default (None) with --passive only, which is what
    # uses the spans; its host None: --listen's.
    traces_receiver: bool | None = None
    traces_listen_host: str | None = None
    traces_listen_port: int = Field(default=DEFAULT_TRACES_PORT, ge=0, le=65535)
    traces_max_rate: float = Field(default=ReceiverLimits().spans_per_s, gt=0, le=1e6)  # spans a second
    # TLS for both ports (PEM files); None: plain HTTP (docs/security.md: or terminate it in front)
    tls_cert_file: Path | None = None
    tls_key_file: Path | None = None

    @model_validator(mode="after")
    def _check(self) -> ExporterConfig:
        if self.passive and self.injecting:
            raise ValueError(f"--passive injects nothing, but --inject-every {self.inject_every_s:g}s asks for "
                             "injection: leave --inject-every out (or set it to off) with --passive")
        if self.decision_file is not None and not self.passive:
            raise ValueError(f"--decision {self.decision_file}: the live threshold comes from the production prefills "
                             "passive mode sees: add --passive")
        problem = adapter(self.engine).budget_problem(self.chunk_size, self.probe_streams) if self.engine else None
        if problem:
            raise ValueError(f"--decode-batch-size {self.probe_streams} with --chunk-size {self.chunk_size}: {problem}")
        if self.injecting:
            room = self.protocol.decode_output_tokens - self.protocol.inject_at_tokens
            if self.reserve_tokens > room:
                raise ValueError(
                    f"--new-prefill-tokens {self.prefill_tokens}: a window needs about {self.reserve_tokens} probe "
                    f"tokens after the injection, the probes have {room} (raise --decode-output-tokens)"
                )
        return self

    @property
    def serves_traces(self) -> bool:
        return self.passive if self.traces_receiver is None else self.traces_receiver

    @property
    def traces_host(self) -> str:
        return self.listen_host if self.traces_listen_host is None else self.traces_listen_host

    @property
    def receiver_limits(self) -> ReceiverLimits:
        return ReceiverLimits(spans_per_s=self.traces_max_rate, span_burst=max(1, round(10 * self.traces_max_rate)))

    @property
    def traces_max_age_s(self) -> float:
        """How far back a span may end and still be attributed: as long as passive mode keeps requests."""
        return self.attribution_wait_s + self.baseline_span_s + 30.0

    @property
    def injecting(self) -> bool:
        return self.inject_every_s is not None

    @property
    def reserve_tokens(self) -> int:
        """Tokens every probe must still have to decode when a prefill goes in (one window's; for an
        engine not yet known, by vLLM's rule, which gives the most chunks)."""
        return self.protocol.window_tokens(self.engine or UNIDENTIFIED, self.prefill_tokens, self.chunk_size,
                                           self.probe_streams)


def build_config(**fields: object) -> ExporterConfig:
    """`ExporterConfig(**fields)` with a validation failure turned into one line naming the field."""
    from pydantic import ValidationError

    try:
        return ExporterConfig(**fields)
    except ValidationError as exc:
        raise ConfigError(format_option_error(exc, ExporterConfig, OPTION_NAMES)) from exc


OPTION_NAMES = {
    "probe_streams": "--decode-batch-size",
    "chunk_size": "--chunk-size",
    "inject_every_s": "--inject-every",
    "prefill_tokens": "--new-prefill-tokens",
    "listen_port": "--listen",
    "duration_s": "--duration",
    "scrape_interval_s": "--scrape-interval",
    "attribution_wait_s": "--attribution-wait",
    "decision_file": "--decision",
    "threshold_every_s": "--threshold-every",
    "engine_wait_s": "--engine-wait",
    "read_timeout_s": "--read-timeout",
    "traces_listen_port": "--traces-listen",
    "traces_max_rate": "--traces-max-rate",
}

