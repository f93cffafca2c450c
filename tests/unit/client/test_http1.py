"""The plain-socket path's HTTP/1.1 framing: request bytes, response head, chunked bodies split anyhow."""

from __future__ import annotations

import json

import pytest

from pdexporter.client.http1 import HttpFramingError, ResponseReader, parse_head, request_bytes
from pdexporter.client.sse import SSEParser, StreamDecoder


def _chunked(pieces: list[bytes]) -> bytes:
    return b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in pieces) + b"0\r\n\r\n"


HEAD = (b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream; charset=utf-8\r\n"
        b"Transfer-Encoding: chunked\r\nDate: x\r\n\r\n")


def _sse_events(n: int) -> list[bytes]:
    """One `data:` event per write, as vLLM sends them, with usage on every event."""
    out = []
    for k in range(1, n + 1):
        event = {"id": "cmpl-1", "object": "text_completion", "choices": [{"index": 0, "text": f" t{k}"}],
                 "usage": {"prompt_tokens": 4, "completion_tokens": k, "total_tokens": 4 + k}}
        out.append(b"data: " + json.dumps(event).encode() + b"\n\n")
    return [*out, b"data: [DONE]\n\n"]


def test_request_bytes_carry_the_bearer_token_length_and_close() -> None:
    raw = request_bytes("POST", "127.0.0.1:8000", "/v1/completions",
                        {"Content-Type": "application/json", "Authorization": "Bearer s3cret"}, b'{"a":1}')
    head, _, body = raw.partition(b"\r\n\r\n")
    lines = head.decode().split("\r\n")
    assert lines[0] == "POST /v1/completions HTTP/1.1"
    assert "Host: 127.0.0.1:8000" in lines and "Authorization: Bearer s3cret" in lines
    assert "Content-Length: 7" in lines and "Connection: close" in lines
    assert body == b'{"a":1}'


def test_a_header_with_a_line_break_is_refused() -> None:
    with pytest.raises(ValueError, match="Authorization"):
        request_bytes("POST", "h", "/", {"Authorization": "Bearer x\r\nX-Evil: 1"}, b"")


def test_head_parsing_joins_repeated_headers_and_lowercases_names() -> None:
    head = parse_head(b"HTTP/1.1 404 Not Found\r\nX-A: 1\r\nx-a: 2\r\nContent-Length: 0")
    assert head.status == 404 and head.reason == "Not Found" and head.headers["x-a"] == "1, 2"
    with pytest.raises(HttpFramingError, match="status line"):
        parse_head(b"SSH-2.0-OpenSSH_9.6")
    with pytest.raises(HttpFramingError, match="header line"):
        parse_head(b"HTTP/1.1 200 OK\r\nno colon here")


@pytest.mark.parametrize("size", [1, 2, 3, 5, 7, 13, 64, 4096])
def test_sse_over_chunked_gives_the_same_events_whatever_the_segment_size(size: int) -> None:
    events = _sse_events(6)
    wire = HEAD + _chunked(events)
    reader, parser, decoder = ResponseReader(), SSEParser(), StreamDecoder()
    tokens = []
    for i in range(0, len(wire), size):
        for event in parser.feed(reader.feed(wire[i : i + size])):
            tokens.append(decoder.decode(event).n_tokens)
    assert reader.complete and reader.head is not None and reader.head.status == 200 and reader.chunked
    assert decoder.done and tokens == [1, 1, 1, 1, 1, 1, 0]


def test_each_event_is_completed_by_the_segment_that_ends_it() -> None:
    """Segments cut an event across two chunks, and carry two events in one: the event list per
    read is what decides each event's stamp."""
    a, b, c, done = _sse_events(3)
    body = a + b[:10]  # event a, and the start of b
    wire = [HEAD + _chunked([body])[:-5],  # the first chunk (without the last-chunk marker)
            b"%x\r\n%s\r\n" % (len(b) - 10 + len(c), b[10:] + c),  # rest of b, and c, in one chunk
            b"%x\r\n%s\r\n0\r\n\r\n" % (len(done), done)]
    reader, parser = ResponseReader(), SSEParser()
    per_read = [[e.data[:12] for e in parser.feed(reader.feed(seg))] for seg in wire]
    assert [len(r) for r in per_read] == [1, 2, 1]
    assert per_read[2] == ["[DONE]"] and reader.complete


def test_chunk_extensions_and_trailers_are_skipped() -> None:
    reader = ResponseReader()
    body = reader.feed(HEAD + b"5;name=value\r\nhello\r\n0\r\nX-Trailer: 1\r\n\r\n")
    assert body == b"hello" and reader.complete


def test_bytes_after_the_last_chunk_are_not_body() -> None:
    reader = ResponseReader()
    assert reader.feed(HEAD + b"2\r\nhi\r\n0\r\n\r\nHTTP/1.1 200 OK\r\n") == b"hi"
    assert reader.complete and reader.feed(b"more") == b""


def test_content_length_and_close_delimited_bodies() -> None:
    reader = ResponseReader()
    assert reader.feed(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 11\r\n\r\n{\"error\":") == b'{"error":'
    assert not reader.complete
    assert reader.feed(b"1}junk") == b"1}" and reader.complete
    reader = ResponseReader()
    assert reader.feed(b"HTTP/1.0 200 OK\r\n\r\ndata: x\n\n") == b"data: x\n\n"
    assert not reader.complete and reader.eof() and reader.complete


def test_a_chunked_body_cut_short_is_not_complete() -> None:
    reader = ResponseReader()
    reader.feed(HEAD + b"10\r\nonly part")
    assert not reader.eof() and not reader.complete


def test_interim_answers_are_skipped() -> None:
    reader = ResponseReader()
    body = reader.feed(b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
    assert reader.head is not None and reader.head.status == 200 and body == b"ok" and reader.complete


@pytest.mark.parametrize("wire, match", [
    (HEAD + b"zz\r\n", "chunk size"),
    (HEAD + b"2\r\nhiXX", "CRLF"),
    (b"HTTP/1.1 200 OK\r\nContent-Length: -3\r\n\r\n", "Content-Length"),
    (b"HTTP/1.1 200 OK\r\nContent-Length: ten\r\n\r\n", "Content-Length"),
])
def test_malformed_framing_is_one_line(wire: bytes, match: str) -> None:
    with pytest.raises(HttpFramingError, match=match) as excinfo:
        ResponseReader().feed(wire)
    assert "\n" not in str(excinfo.value)


def test_an_endless_head_is_refused() -> None:
    reader = ResponseReader()
    with pytest.raises(HttpFramingError, match="head longer"):
        for _ in range(100):
            reader.feed(b"X-Filler: " + b"a" * 1000 + b"\r\n")
