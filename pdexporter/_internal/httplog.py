"""What aiohttp's server logs of a request it could not even parse: nothing (its 400 is the answer)."""

from __future__ import annotations

import logging

__all__ = ["quiet_malformed_requests"]


class _MalformedRequests(logging.Filter):
    """aiohttp answers a request it cannot parse (a header over 8 KB, an HTTP/2 preface) with 400 and
    logs "Error handling request" with a traceback quoting the client's bytes: 8-10 lines on
    stderr per request, which any unauthenticated client could repeat (the runtime audit of session
    22). The 400 is the answer; the log line is dropped. Any other server error is still logged."""

    def filter(self, record: logging.LogRecord) -> bool:
        from aiohttp.http_exceptions import HttpProcessingError

        exc = record.exc_info[1] if record.exc_info else None
        return not isinstance(exc, HttpProcessingError)


def quiet_malformed_requests() -> None:
    """Install `_MalformedRequests` on aiohttp's server logger, once."""
    logger = logging.getLogger("aiohttp.server")
    if not any(isinstance(f, _MalformedRequests) for f in logger.filters):
        logger.addFilter(_MalformedRequests())
