"""Why the exporter is up or not: `pdexporter_up` and its reason, as pure functions.

`pdexporter_up` is 1 only while all N probe streams are decoding and tokens are arriving. When it
is 0, `pdexporter_up_reason{reason}` says why, with one of a fixed set of values
(`metrics.UP_REASONS`; docs/metrics.md), so an alert can tell "the engine is still loading" from
"the engine answers with errors" from "the engine hangs":

    starting               the exporter has not reached the engine yet (its first attempt)
    engine-unreachable     connection refused or lost (not started yet, restarting, gone)
    engine-timeout         the engine accepted the connection but did not answer in time
    engine-http-error      the engine answered with an HTTP error (503 while loading, a proxy's 404)
    engine-protocol-error  the answer was not what vLLM sends (malformed SSE, not a model list)
    probes-stalled         probe streams are open but no token came for `STALL_S`
    probes-restarting      fewer than N probes decoding, no error: between a probe's end and its successor
    stopping               SIGTERM/SIGINT: the exporter is shutting down

`exporter.startup` sets the reason while it waits for the engine, `exporter.book` while the
probes run.
"""

from __future__ import annotations

from pdexporter.exporter.metrics import error_kind

__all__ = [
    "STALL_S", "reason_of", "up_reason",
]

STALL_S = 10.0  # `pdexporter_up` drops when no probe token arrived for this long

_BY_KIND = {"connect": "engine-unreachable", "timeout": "engine-timeout", "http": "engine-http-error",
            "protocol": "engine-protocol-error", "measurement": "engine-protocol-error"}


def reason_of(exc: BaseException) -> str:
    """The up reason an engine failure stands for (`error_kind` groups them)."""
    return _BY_KIND[error_kind(exc)]


def up_reason(*, open_probes: int, wanted: int, seconds_since_token: float, probe_thread_ok: bool,
              last_error: BaseException | None) -> str:
    """The reason while the probes run. `last_error`: the failure of the last probe stream that
    ended, if no token arrived since (a probe that fails is restarted with a back-off)."""
    if not probe_thread_ok:
        return "engine-protocol-error" if last_error is None else reason_of(last_error)
    fresh = seconds_since_token < STALL_S
    if open_probes == wanted and fresh:
        return "ok"
    if last_error is not None:
        return reason_of(last_error)
    if not fresh:
        return "probes-stalled"
    return "probes-restarting"
