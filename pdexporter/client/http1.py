"""The client side of one HTTP/1.1 exchange, pure: a request's bytes, and a response read incrementally.

Just what the kernel-stamped stream path (`client.kstamp`) needs to POST a streaming request on a
plain socket: no keep-alive (`Connection: close`), no TLS, no redirects. `ResponseReader.feed`
takes whatever bytes one read returned and gives back the body bytes they completed, whatever the
split: a read can end inside the head, inside a chunk-size line, or inside a chunk; one read can
carry several chunks. Framing, in HTTP/1.1's order: `Transfer-Encoding: chunked`, else
`Content-Length`, else the body runs until the server closes.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

__all__ = [
    "HttpFramingError", "MAX_HEAD_BYTES", "MAX_LINE_BYTES", "ResponseHead", "ResponseReader", "parse_head",
    "request_bytes",
]

MAX_HEAD_BYTES = 64 * 1024
MAX_LINE_BYTES = 8 * 1024


class HttpFramingError(ValueError):
    """The server's bytes are not an HTTP/1.1 response; the message is one line."""


def request_bytes(method: str, host: str, path: str, headers: Mapping[str, str], body: bytes) -> bytes:
    """The request head and body. `host` is the Host header's value (host[:port])."""
    lines = [f"{method} {path} HTTP/1.1", f"Host: {host}"]
    for name, value in headers.items():
        if any(c in value for c in "\r\n") or any(c in name for c in "\r\n:"):
            raise ValueError(f"HTTP header {name!r}: line breaks are not allowed in a header")
        lines.append(f"{name}: {value}")
    lines += [f"Content-Length: {len(body)}", "Connection: close", "", ""]
    return "\r\n".join(lines).encode("latin-1") + body


@dataclass(frozen=True)
class ResponseHead:
    status: int
    reason: str
    headers: dict[str, str]  # lower-case names; repeated headers joined with ", "


def parse_head(raw: bytes) -> ResponseHead:
    """The status line and headers (without the blank line that ends them)."""
    text = raw.decode("latin-1")
    status_line, *header_lines = text.split("\r\n")
    version, _, rest = status_line.partition(" ")
    code, _, reason = rest.partition(" ")
    if not version.startswith("HTTP/1.") or len(code) != 3 or not code.isdigit():
        raise HttpFramingError(f"not an HTTP/1.x status line: {status_line[:80]!r}")
    headers: dict[str, str] = {}
    for line in header_lines:
        name, sep, value = line.partition(":")
        if not sep or not name or name != name.strip():
            raise HttpFramingError(f"malformed header line: {line[:80]!r}")
        key = name.lower()
        value = value.strip()
        headers[key] = f"{headers[key]}, {value}" if key in headers else value
    return ResponseHead(int(code), reason, headers)


_HEAD, _CHUNK_SIZE, _CHUNK_DATA, _CHUNK_END, _TRAILER, _LENGTH, _UNTIL_CLOSE, _DONE = range(8)


class ResponseReader:
    """Incremental HTTP/1.1 response parser: `feed(bytes) -> body bytes`, `eof() -> complete?`."""

    def __init__(self, *, head_request: bool = False) -> None:
        self.head: ResponseHead | None = None
        self._head_request = head_request
        self._state = _HEAD
        self._buf = b""
        self._remaining = 0

    @property
    def complete(self) -> bool:
        """The body ended by its framing (last chunk, or Content-Length bytes)."""
        return self._state == _DONE

    @property
    def chunked(self) -> bool:
        return self.head is not None and "chunked" in self.head.headers.get("transfer-encoding", "").lower()

    def feed(self, data: bytes) -> bytes:
        if self._state == _DONE:
            return b""  # bytes after the end of the response: nothing of ours
        if self._state == _UNTIL_CLOSE:
            return data
        if self._state == _LENGTH:
            return self._length(data)
        buf = self._buf + data if self._buf else data
        self._buf = b""
        if self._state == _HEAD:
            end = buf.find(b"\r\n\r\n")
            if end < 0:
                if len(buf) > MAX_HEAD_BYTES:
                    raise HttpFramingError(f"response head longer than {MAX_HEAD_BYTES} bytes")
                self._buf = buf
                return b""
            head = parse_head(buf[:end])
            rest = buf[end + 4 :]
            if 100 <= head.status < 200:  # an interim answer (100 Continue): the real one follows
                return self.feed(rest)
            self.head = head
            self._start_body(head)
            if self._state == _LENGTH:
                return self._length(rest)
            if self._state == _UNTIL_CLOSE:
                return rest
            if self._state == _DONE:
                return b""
            buf = rest
        return self._chunks(buf)

    def eof(self) -> bool:
        """The server closed: True if that ends the body (close-delimited), False if it cut it short."""
        if self._state == _UNTIL_CLOSE:
            self._state = _DONE
        return self._state == _DONE

    def _start_body(self, head: ResponseHead) -> None:
        if self._head_request or head.status in (204, 304):
            self._state = _DONE
        elif self.chunked:
            self._state = _CHUNK_SIZE
        elif "content-length" in head.headers:
            try:
                self._remaining = int(head.headers["content-length"])
            except ValueError:
                raise HttpFramingError(f"bad Content-Length {head.headers['content-length'][:40]!r}") from None
            if self._remaining < 0:
                raise HttpFramingError(f"bad Content-Length {self._remaining}")
            self._state = _LENGTH if self._remaining else _DONE
        else:
            self._state = _UNTIL_CLOSE

    def _length(self, data: bytes) -> bytes:
        if len(data) >= self._remaining:
            data = data[: self._remaining]
            self._remaining = 0
            self._state = _DONE
            return data
        self._remaining -= len(data)
        return data

    def _chunks(self, buf: bytes) -> bytes:
        """Chunked transfer coding; the common case (whole chunks in one read) is a few slices."""
        out: list[bytes] = []
        pos, n = 0, len(buf)
        while pos < n:
            state = self._state
            if state == _CHUNK_DATA:
                take = min(self._remaining, n - pos)
                out.append(buf[pos : pos + take])
                pos += take
                self._remaining -= take
                if self._remaining == 0:
                    self._state = _CHUNK_END
                continue
            if state == _CHUNK_END:  # exactly CRLF after a chunk's data
                if not self._crlf_at(buf, pos):
                    break  # a lone CR: the LF comes in the next read
                pos += 2
                self._state = _CHUNK_SIZE
                continue
            end = buf.find(b"\r\n", pos)
            if end < 0:
                if n - pos > MAX_LINE_BYTES:
                    raise HttpFramingError("chunk framing line too long")
                self._buf = buf[pos:]
                break
            line = buf[pos:end]
            pos = end + 2
            if not self._framing_line(state, line):
                break
        return b"".join(out) if len(out) != 1 else out[0]

    def _crlf_at(self, buf: bytes, pos: int) -> bool:
        """Whether the CRLF that ends a chunk's data is at `pos`; False (kept for the next read)
        when only its CR has come; anything else is a framing error."""
        if len(buf) - pos < 2:
            if buf[pos:] != b"\r":
                raise HttpFramingError(f"chunk not followed by CRLF: {buf[pos:pos + 2]!r}")
            self._buf = buf[pos:]
            return False
        if buf[pos : pos + 2] != b"\r\n":
            raise HttpFramingError(f"chunk not followed by CRLF: {buf[pos:pos + 2]!r}")
        return True

    def _framing_line(self, state: int, line: bytes) -> bool:
        """A chunk-size or trailer line read in `state`; False once the body has ended."""
        if state == _CHUNK_SIZE:
            size_text = line.split(b";", 1)[0].strip()
            try:
                size = int(size_text, 16)
            except ValueError:
                raise HttpFramingError(f"bad chunk size {line[:40]!r}") from None
            if size < 0:
                raise HttpFramingError(f"bad chunk size {line[:40]!r}")
            if size == 0:
                self._state = _TRAILER
            else:
                self._remaining, self._state = size, _CHUNK_DATA
            return True
        if state == _TRAILER and line:
            return True  # a trailer field: read and dropped
        if state == _TRAILER:
            self._state = _DONE
        return False  # the blank line after the trailers, or _DONE
