"""Ending an OpenTelemetry tracer provider within a time limit.

`TracerProvider.force_flush(timeout)` does not keep to its timeout (SDK 1.45: the batch processor
exports its whole queue, and the OTLP/HTTP exporter retries each batch for up to its own timeout,
10 s by default), so with the receiver gone a process that flushes on exit waited ~7 s and more.
`shutdown_within` gives the last export `seconds`, then shuts the exporter down, which ends the
retries in flight; what is still queued is dropped.
"""

from __future__ import annotations

import threading
from typing import Any

__all__ = ["shutdown_within"]


def shutdown_within(provider: Any, exporter: Any, seconds: float) -> None:
    """`provider.shutdown()` (its batch processor's last export, then the exporter's shutdown),
    with `exporter.shutdown()` called early once `seconds` have passed."""
    give_up = threading.Timer(seconds, exporter.shutdown)
    give_up.daemon = True
    give_up.start()
    try:
        provider.shutdown()
    finally:
        give_up.cancel()
