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
    probes-stalled         an open probe stream (or all of them) got no token for `STALL_S`
    probes-restarting      fewer than N probes decoding, no error, for longer than a normal hand-over
                           (`RESTART_GRACE_S`: a probe that ended well waits up to 5 s for the
                           others, to restart in phase) — a slot that is not coming back
    stopping               SIGTERM/SIGINT: the exporter is shutting down

`exporter.startup` sets the reason while it waits for the engine, `exporter.book` while the
probes run.
"""

from __future__ import annotations

from pdexporter.exporter.metrics import error_kind

__all__ = [
    "RESTART_GRACE_S", "STALL_S", "reason_of", "up_reason",
]

STALL_S = 10.0  # `pdexporter_up` drops when no probe token arrived for this long
# A probe that ended well is replaced within `probes.ALIGN_WAIT_S` (5 s, waiting for the others to
# end so that all restart in phase): the slot counts as running for this long after its end, so
# `pdexporter_up` does not flap to 0 at every probe hand-over (it did, for a scrape that fell in one).
RESTART_GRACE_S = 6.0

_BY_KIND = {"connect": "engine-unreachable", "timeout": "engine-timeout", "http": "engine-http-error",
            "protocol": "engine-protocol-error", "measurement": "engine-protocol-error"}


def reason_of(exc: BaseException) -> str:
    """The up reason an engine failure stands for (`error_kind` groups them)."""
    return _BY_KIND[error_kind(exc)]


def up_reason(*, open_probes: int, wanted: int, seconds_since_token: float, probe_thread_ok: bool,
              last_error: BaseException | None, stalled_probes: int = 0, handing_over: int = 0) -> str:
    """The reason while the probes run. `last_error`: the failure of the last probe stream that
    failed (or of the last attempt of one being retried), if no token arrived since: it wins over
    "ok", so an engine that dies is `up 0` at the first broken stream and stays so, without
    flapping, until tokens flow again. `stalled_probes`: open probes silent for `STALL_S`.
    `handing_over`: slots whose stream ended well less than `RESTART_GRACE_S` ago and whose
    successor has not started: they count as running."""
    if not probe_thread_ok:
        return "engine-protocol-error" if last_error is None else reason_of(last_error)
    if last_error is not None:
        return reason_of(last_error)
    if stalled_probes or seconds_since_token >= STALL_S:
        return "probes-stalled"
    if open_probes + handing_over >= wanted:
        return "ok"
    return "probes-restarting"
