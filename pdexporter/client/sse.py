"""Server-sent events as vLLM's OpenAI server writes them, parsed incrementally and purely.

`SSEParser.feed(bytes)` returns the events completed by those bytes, whatever the split: a TCP
read can end mid-line, or carry several events. `StreamDecoder` turns each event's JSON into a
`StreamDelta` that says how many *tokens* it carried, which is what TPOT is about.

Token counting, in order of trust:
1. `usage.completion_tokens` on the event (vLLM's `continuous_usage_stats`): the delta from the
   previous event's count is exact, also when the engine packs several tokens into one event.
2. `token_ids` on the choice (vLLM's `return_token_ids`): its length.
3. Otherwise one token per event whose choice carries text or content (vLLM sends one event per
   output step and stream), none for role-only or finish-only events.
The final usage-only event (`choices: []`) carries no tokens; its usage is kept for checks.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from pdexporter._internal.text import body_reason, shorten
from pdexporter.errors import EngineError, EngineHTTPError, SSEProtocolError

__all__ = [
    "ERROR_LIMIT", "SSEEvent", "SSEParser", "StreamDecoder", "StreamDelta", "error_message_from_body", "http_error",
]


@dataclass(frozen=True, slots=True)
class SSEEvent:
    """One event: its `data:` lines joined with newlines (the SSE rule), its `event:` name, and the
    comment lines (`: ...`) of its block, joined with newlines (vLLM sends none;
    the embedded engine's opt-in send stamps ride there, see `sim.server.SEND_STAMPS_HEADER`)."""

    data: str
    event: str | None = None
    comment: str | None = None


class SSEParser:
    """Incremental SSE tokenizer; keeps the unfinished tail between `feed` calls."""

    def __init__(self) -> None:
        self._buffer = b""
        self._data: list[str] = []
        self._event: str | None = None
        self._comments: list[str] = []

    def feed(self, chunk: bytes) -> list[SSEEvent]:
        self._buffer += chunk
        events: list[SSEEvent] = []
        while True:
            newline = self._buffer.find(b"\n")
            if newline < 0:
                break
            raw = self._buffer[:newline]
            self._buffer = self._buffer[newline + 1 :]
            if raw.endswith(b"\r"):
                raw = raw[:-1]
            event = self._line(raw)
            if event is not None:
                events.append(event)
        return events

    def close(self) -> list[SSEEvent]:
        """End of body: an event not followed by a blank line still counts (lenient, like browsers are not)."""
        events = self.feed(b"\n") if self._buffer else []
        if self._data:
            events.append(self._dispatch())
        return events

    def _dispatch(self) -> SSEEvent:
        comment = "\n".join(self._comments) if self._comments else None
        event = SSEEvent("\n".join(self._data), self._event, comment)
        self._data, self._event = [], None
        if comment is not None:
            self._comments = []
        return event

    def _line(self, raw: bytes) -> SSEEvent | None:
        if not raw:
            if not self._data:
                self._event = None
                if self._comments:
                    self._comments = []  # a block of comments only (a keep-alive) ends with it
                return None
            return self._dispatch()
        if raw.startswith(b":"):
            # comment / keep-alive: kept for the event of this block
            text = raw[1:].decode("utf-8", "replace").removeprefix(" ")
            if text:
                self._comments.append(text)
            return None
        name, _, value = raw.partition(b":")
        if value.startswith(b" "):
            value = value[1:]
        try:
            text = value.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise SSEProtocolError(f"SSE line is not UTF-8: {raw[:80]!r}") from exc
        if name == b"data":
            self._data.append(text)
        elif name == b"event":
            self._event = text
        # id / retry / unknown fields carry nothing we use.
        return None


@dataclass(frozen=True, slots=True)
class StreamDelta:
    """What one event contributed to a generation stream."""

    n_tokens: int
    done: bool = False
    finish_reason: str | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    text: str = ""


@dataclass
class StreamDecoder:
    """Turns SSE events of `/v1/completions` or `/v1/chat/completions` into token counts."""

    source: str = "engine"
    counted: int = 0
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    finish_reason: str | None = None
    done: bool = False

    def decode(self, event: SSEEvent) -> StreamDelta:
        data = event.data.strip()
        if data == "[DONE]":
            self.done = True
            return StreamDelta(0, done=True, finish_reason=self.finish_reason)
        choices, usage = self._payload(data)
        prompt_tokens = _int_or_none(usage, "prompt_tokens")
        completion_tokens = _int_or_none(usage, "completion_tokens")
        if prompt_tokens is not None:
            self.prompt_tokens = prompt_tokens
        if not choices:
            # The usage-only closing event: tokens were counted on the events that carried them.
            if completion_tokens is not None:
                self.completion_tokens = completion_tokens
            return StreamDelta(0, prompt_tokens=prompt_tokens, completion_tokens=completion_tokens)
        text, finish_reason, n_tokens = self._choices(choices, count=completion_tokens is None, data=data)
        if completion_tokens is not None:
            n_tokens = self._usage_step(completion_tokens)
        if finish_reason:
            self.finish_reason = finish_reason
        self.counted += n_tokens
        return StreamDelta(
            n_tokens,
            finish_reason=finish_reason,
            prompt_tokens=prompt_tokens,
            completion_tokens=completion_tokens,
            text=text,
        )

    def _payload(self, data: str) -> tuple[list[Any], dict[str, Any] | None]:
        """An event's choices and usage; an event that is not a completion chunk is one error."""
        try:
            payload = json.loads(data)
        except json.JSONDecodeError as exc:
            raise SSEProtocolError(f"{self.source}: SSE event is not JSON: {data[:120]!r}") from exc
        if not isinstance(payload, dict):
            raise SSEProtocolError(f"{self.source}: SSE event is not a JSON object: {data[:120]!r}")
        if "error" in payload or payload.get("object") == "error":
            raise EngineError(f"{self.source} reported an error mid-stream: {_error_message(payload)}")
        choices = payload.get("choices")
        if choices is None:
            raise SSEProtocolError(f"{self.source}: SSE event has no 'choices': {data[:120]!r}")
        usage = payload.get("usage") or None
        if usage is not None and not isinstance(usage, dict):
            raise SSEProtocolError(f"{self.source}: 'usage' is not an object: {data[:120]!r}")
        return choices, usage

    def _choices(self, choices: list[Any], *, count: bool, data: str) -> tuple[str, str | None, int]:
        """The choices' text and finish reason, and (`count`: the event carries no usage) their
        tokens: a choice's token ids, else one token per choice with text."""
        text, finish_reason, n_tokens = "", None, 0
        for choice in choices:
            if not isinstance(choice, dict):
                raise SSEProtocolError(f"{self.source}: a choice is not an object: {data[:120]!r}")
            piece = _choice_text(choice)
            text += piece
            finish_reason = choice.get("finish_reason") or finish_reason
            if count:
                token_ids = choice.get("token_ids")
                n_tokens += len(token_ids) if isinstance(token_ids, list) else 1 if piece else 0
        return text, finish_reason, n_tokens

    def _usage_step(self, completion_tokens: int) -> int:
        """The tokens a running usage count adds since the last event's."""
        previous = self.completion_tokens or 0
        if completion_tokens < previous:
            raise SSEProtocolError(
                f"{self.source}: usage.completion_tokens went backwards ({previous} -> {completion_tokens})"
            )
        self.completion_tokens = completion_tokens
        return completion_tokens - previous


def _choice_text(choice: dict[str, Any]) -> str:
    if isinstance(choice.get("text"), str):
        return choice["text"]
    delta = choice.get("delta")
    if isinstance(delta, dict):
        content = delta.get("content")
        reasoning = delta.get("reasoning_content") or delta.get("reasoning")
        return (content if isinstance(content, str) else "") + (reasoning if isinstance(reasoning, str) else "")
    return ""


def _int_or_none(mapping: dict[str, Any] | None, key: str) -> int | None:
    if not mapping:
        return None
    value = mapping.get(key)
    return int(value) if isinstance(value, (int, float)) else None


def _error_message(payload: dict[str, Any]) -> str:
    error = payload.get("error", payload)
    if isinstance(error, dict):
        return str(error.get("message") or error)
    return str(error)


ERROR_LIMIT = 300  # characters of an engine's error message kept in ours (vLLM's are long sentences)


def http_error(url: str, status: int, body: bytes) -> EngineHTTPError:
    """The error for an engine's HTTP error answer. A 401 or 403 says what to check, not what the
    server said: an auth proxy may echo the credentials it was given."""
    if status in (401, 403):
        return EngineHTTPError(url, status, "the engine refused the credentials: check --api-key-file "
                               "(or $PDEXPORTER_API_KEY)")
    return EngineHTTPError(url, status, error_message_from_body(body))


def error_message_from_body(body: bytes | str) -> str:
    """The human part of an engine's error body (vLLM/OpenAI JSON, or plain text), as one line; an
    HTML page (a proxy's or another server's 404) is cut down to its title and first words."""
    text = body.decode("utf-8", "replace") if isinstance(body, bytes) else body
    try:
        payload = json.loads(text)
    except (json.JSONDecodeError, ValueError):
        return body_reason(text, ERROR_LIMIT)  # plain text, or some other server's HTML page
    if isinstance(payload, dict):
        if "error" in payload or "message" in payload or "detail" in payload:
            if "detail" in payload and "error" not in payload and "message" not in payload:
                return shorten(str(payload["detail"]), ERROR_LIMIT)
            return shorten(_error_message(payload), ERROR_LIMIT)
    return shorten(text, ERROR_LIMIT)
