"""SSE parsing and token counting, on real vLLM 0.22 events and on split/merged byte streams."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pdexporter.client.sse import SSEParser, StreamDecoder, error_message_from_body
from pdexporter.errors import EngineError, SSEProtocolError
from tests.conftest import VLLM_FIXTURES

REAL_STREAM = (VLLM_FIXTURES / "sse-completions.txt").read_bytes()


def _count(chunks: list[bytes]) -> tuple[int, int, bool]:
    parser, decoder = SSEParser(), StreamDecoder()
    events = 0
    for chunk in chunks:
        for event in parser.feed(chunk):
            decoder.decode(event)
            events += 1
    for event in parser.close():
        decoder.decode(event)
        events += 1
    return decoder.counted, events, decoder.done


def _with_usage_stream(n_tokens: int, per_event: list[int]) -> bytes:
    """A vLLM-shaped stream with continuous usage stats: some events carry several tokens."""
    out, done = [], 0
    for n in per_event:
        done += n
        out.append({"id": "cmpl-1", "object": "text_completion", "created": 1, "model": "m",
                    "choices": [{"index": 0, "text": " t1" * n, "logprobs": None, "finish_reason": None}],
                    "usage": {"prompt_tokens": 7, "total_tokens": 7 + done, "completion_tokens": done}})
    assert done == n_tokens
    out.append({"id": "cmpl-1", "object": "text_completion", "created": 1, "model": "m", "choices": [],
                "usage": {"prompt_tokens": 7, "total_tokens": 7 + done, "completion_tokens": done}})
    return b"".join(b"data: " + json.dumps(e).encode() + b"\n\n" for e in out) + b"data: [DONE]\n\n"


def test_real_vllm_events_count_one_token_each(vllm_sse_bytes: bytes) -> None:
    tokens, events, _ = _count([vllm_sse_bytes])
    assert events == 4
    assert tokens == 4


def test_done_marker_ends_the_stream(vllm_sse_bytes: bytes) -> None:
    tokens, events, done = _count([vllm_sse_bytes + b"data: [DONE]\n\n"])
    assert (tokens, events, done) == (4, 5, True)


@settings(max_examples=200, deadline=None)
@given(data=st.data())
def test_any_split_of_the_real_stream_counts_the_same(data: st.DataObject) -> None:
    stream = REAL_STREAM + b"data: [DONE]\n\n"
    cuts = sorted(data.draw(st.sets(st.integers(1, len(stream) - 1), max_size=40)))
    chunks = [stream[a:b] for a, b in zip([0, *cuts], [*cuts, len(stream)])]
    assert _count(chunks) == (4, 5, True)


@settings(max_examples=200, deadline=None)
@given(
    per_event=st.lists(st.integers(1, 5), min_size=1, max_size=30),
    cut_fracs=st.lists(st.floats(0, 1), max_size=25),
    crlf=st.booleans(),
)
def test_usage_counts_survive_splits_merges_and_crlf(per_event: list[int], cut_fracs: list[float], crlf: bool) -> None:
    total = sum(per_event)
    stream = _with_usage_stream(total, per_event)
    if crlf:
        stream = stream.replace(b"\n", b"\r\n")
    cuts = sorted({int(f * (len(stream) - 1)) + 1 for f in cut_fracs})
    chunks = [stream[a:b] for a, b in zip([0, *cuts], [*cuts, len(stream)])]
    tokens, _, done = _count(chunks)
    assert tokens == total
    assert done


def test_usage_only_final_event_adds_no_token_without_continuous_stats() -> None:
    events = [
        {"choices": [{"index": 0, "text": " a", "finish_reason": None}]},
        {"choices": [{"index": 0, "text": " b", "finish_reason": "length"}]},
        {"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}},
    ]
    raw = b"".join(b"data: " + json.dumps(e).encode() + b"\n\n" for e in events)
    parser, decoder = SSEParser(), StreamDecoder()
    for event in parser.feed(raw):
        decoder.decode(event)
    assert decoder.counted == 2
    assert decoder.prompt_tokens == 3
    assert decoder.finish_reason == "length"


def test_chat_role_only_delta_is_not_a_token() -> None:
    events = [
        {"object": "chat.completion.chunk", "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}],
         "usage": {"prompt_tokens": 5, "completion_tokens": 0, "total_tokens": 5}},
        {"object": "chat.completion.chunk", "choices": [{"index": 0, "delta": {"content": " x"}}],
         "usage": {"prompt_tokens": 5, "completion_tokens": 1, "total_tokens": 6}},
    ]
    parser, decoder = SSEParser(), StreamDecoder()
    deltas = [
        decoder.decode(e) for e in parser.feed(b"".join(b"data: " + json.dumps(e).encode() + b"\n\n" for e in events))
    ]
    assert [d.n_tokens for d in deltas] == [0, 1]


def test_comments_and_event_names_are_handled() -> None:
    parser = SSEParser()
    events = parser.feed(b": keep-alive\n\nevent: message\ndata: [DONE]\n\n")
    assert len(events) == 1 and events[0].event == "message" and events[0].data == "[DONE]"
    assert events[0].comment is None  # the keep-alive's block ended before this event's


def test_comments_ride_with_the_event_of_their_block_whatever_the_split() -> None:
    """The embedded engine's opt-in send stamps are a comment line before each event."""
    wire = b": sent=1\ndata: a\n\n: sent=2\n: more\ndata: b\n\ndata: c\n\n"
    for cut in range(1, len(wire)):
        parser = SSEParser()
        events = parser.feed(wire[:cut]) + parser.feed(wire[cut:])
        assert [(e.data, e.comment) for e in events] == [("a", "sent=1"), ("b", "sent=2\nmore"), ("c", None)]


@pytest.mark.parametrize(
    "payload, error",
    [
        (b"data: {not json}\n\n", SSEProtocolError),
        (b"data: [1, 2]\n\n", SSEProtocolError),
        (b'data: {"id": "x"}\n\n', SSEProtocolError),
        (b'data: {"error": {"message": "boom", "code": 500}}\n\n', EngineError),
    ],
)
def test_malformed_events_raise_one_line_errors(payload: bytes, error: type[Exception]) -> None:
    parser, decoder = SSEParser(), StreamDecoder(source="http://engine/v1/completions")
    with pytest.raises(error) as excinfo:
        for event in parser.feed(payload):
            decoder.decode(event)
    assert "\n" not in str(excinfo.value)


def test_usage_going_backwards_is_a_protocol_error() -> None:
    events = [
        {"choices": [{"index": 0, "text": "a"}], "usage": {"completion_tokens": 3}},
        {"choices": [{"index": 0, "text": "b"}], "usage": {"completion_tokens": 2}},
    ]
    parser, decoder = SSEParser(), StreamDecoder()
    with pytest.raises(SSEProtocolError, match="backwards"):
        for event in parser.feed(b"".join(b"data: " + json.dumps(e).encode() + b"\n\n" for e in events)):
            decoder.decode(event)


@pytest.mark.parametrize(
    "body, expected",
    [
        (
            b'{"error": {"message": "This model\'s maximum context length is 200000 tokens.", '
            b'"type": "BadRequestError", "code": 400}}',
            "This model's maximum context length is 200000 tokens.",
        ),
        (
            b'{"object": "error", "message": "prompt too long", "type": "BadRequestError", "code": 400}',
            "prompt too long",
        ),
        (b'{"detail": "Not Found"}', "Not Found"),
        (b"Internal Server Error", "Internal Server Error"),
        (b"", "(empty body)"),
    ],
)
def test_engine_error_bodies_give_the_human_message(body: bytes, expected: str) -> None:
    assert error_message_from_body(body) == expected
