"""Small wording helpers for what the commands print."""

from __future__ import annotations


def plural(n: int, word: str, many: str | None = None) -> str:
    """`1 chunk`, `3 chunks`, `0 repetitions`."""
    return f"{n} {word if n == 1 else (many or word + 's')}"
