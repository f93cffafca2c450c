"""Errors a user can act on.

Every error raised for bad input or an unhealthy engine derives from `PdexporterError` and
renders as one line that names the thing that is wrong (file, field, value, URL; a URL's
user:password, and every secret the process holds, shown as `***`: `_internal.redact.redact`).
The CLI prints that line and exits non-zero; anything else escaping is a bug and keeps its
traceback.
"""

from __future__ import annotations

__all__ = [
    "ConfigError", "EngineChanged", "EngineError", "EngineHTTPError", "EngineRefused", "EngineTimeout",
    "EngineUnreachable", "Interrupted", "MeasurementError", "PdexporterError", "RecordError", "SSEProtocolError",
]


class PdexporterError(Exception):
    """Base of all user-facing errors; `str()` is a single line."""

    exit_code: int = 2

    def __str__(self) -> str:
        from pdexporter._internal.redact import redact

        text = super().__str__()
        # one line, whatever the engine sent us; no secret the process holds, no URL password
        return redact(" ".join(text.split()))


class ConfigError(PdexporterError):
    """A CLI option, sweep file or profile has a wrong field or value."""


class RecordError(PdexporterError):
    """A results file cannot be read or does not match the record schema."""


class EngineError(PdexporterError):
    """The engine could not serve a request."""

    exit_code = 3


class EngineUnreachable(EngineError):
    """Connection refused, DNS failure, or the engine went away."""


class EngineRefused(EngineUnreachable):
    """No connection could be made at all (refused, no such host): the engine is not there."""


class EngineTimeout(EngineError):
    """No answer (or no next token) within the allowed time."""


class EngineHTTPError(EngineError):
    """The engine answered with an HTTP error status."""

    def __init__(self, url: str, status: int, message: str) -> None:
        self.url = url
        self.status = status
        self.message = message
        super().__init__(f"{url} answered HTTP {status}: {message}")


class SSEProtocolError(EngineError):
    """The engine's event stream broke vLLM's SSE shape."""


class EngineChanged(EngineError):
    """The engine restarted as another engine (model, version, chunk size) under a running exporter."""


class Interrupted(PdexporterError):
    """The user pressed Ctrl-C (SIGINT); the message says what was kept."""

    exit_code = 130


class MeasurementError(PdexporterError):
    """The protocol could not produce a valid window (e.g. streams never reached steady state)."""

    exit_code = 4
