"""Small wording helpers for what the commands print."""

from __future__ import annotations

import re
from html.parser import HTMLParser
from pathlib import Path

__all__ = [
    "REASON_LIMIT", "body_reason", "looks_like_html", "plural", "read_utf8", "shorten",
]


def read_utf8(path: Path, error: type[Exception], hint: str = "") -> str:
    """A text file's contents; a file that cannot be read, or is not UTF-8, is one `error` naming
    it (and the line and byte that are not UTF-8; `hint` follows that)."""
    try:
        return path.read_text(encoding="utf-8")
    except OSError as exc:
        raise error(f"{path}: cannot read ({exc.strerror or exc})") from exc
    except UnicodeDecodeError as exc:
        line = exc.object[: exc.start].count(b"\n") + 1
        raise error(f"{path}: line {line}: not UTF-8 text (byte 0x{exc.object[exc.start]:02x} at offset "
                    f"{exc.start}){hint}") from None


def plural(n: int, word: str, many: str | None = None) -> str:
    """`1 chunk`, `3 chunks`, `0 repetitions`."""
    return f"{n} {word if n == 1 else (many or word + 's')}"


REASON_LIMIT = 200


class _PageText(HTMLParser):
    """The title and the visible text of an HTML page (scripts and styles skipped)."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.title: list[str] = []
        self.text: list[str] = []
        self._in: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag in ("title", "script", "style", "head"):
            self._in.append(tag)

    def handle_endtag(self, tag: str) -> None:
        if tag in self._in:
            del self._in[len(self._in) - 1 - self._in[::-1].index(tag):]

    def handle_data(self, data: str) -> None:
        if "title" in self._in:
            self.title.append(data)
        elif not self._in:
            self.text.append(data)


def looks_like_html(text: str) -> bool:
    head = text.lstrip()[:512].lower()
    return head.startswith(("<!doctype html", "<html", "<head", "<body")) or "<html" in head


def shorten(text: str, limit: int = REASON_LIMIT) -> str:
    """One line of at most `limit` characters."""
    line = " ".join(text.split())
    return line if len(line) <= limit else line[: limit - 1].rstrip() + "…"


def body_reason(body: bytes | str, limit: int = REASON_LIMIT) -> str:
    """What an HTTP error body says, as one short line: an HTML page (a proxy's or another
    server's 404) becomes its title and the start of its text, never the markup."""
    text = body.decode("utf-8", "replace") if isinstance(body, bytes) else body
    if not text.strip():
        return "(empty body)"
    if not looks_like_html(text):
        return shorten(text, limit)
    page = _PageText()
    try:
        page.feed(text)
        page.close()
    except Exception:  # noqa: BLE001 - malformed markup: fall back to dropping tags crudely
        return shorten(re.sub(r"<[^<>]*>", " ", text), limit)  # not [^>]: a run of "<" was quadratic
    title = " ".join(" ".join(page.title).split())
    rest = " ".join(" ".join(page.text).split())
    if title and rest.startswith(title):
        rest = rest[len(title):].strip()
    reason = ": ".join(part for part in (title, rest) if part) or "(an HTML page with no text)"
    return f"an HTML page ({shorten(reason, limit - 15)})"
