"""The embedded engine's tokenizer: word-level, deterministic, the GPU machine's dummy-model convention.

The dummy Qwen3-Coder model on the GPU machine (`shared/gpu/make_model.py`) has one token per id,
spelt `t<id>`, split on whitespace. Here a word `t123` is id 123 as there; any other word hashes
(blake2b) to an id, so text prompts get stable, realistic-looking token counts without a
vocabulary file. Decoding a token gives " t<id>", which is what vLLM streams for that model.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence
from typing import Any

__all__ = [
    "WordTokenizer",
]


class WordTokenizer:
    def __init__(self, vocab_size: int) -> None:
        self.vocab_size = vocab_size

    def word_id(self, word: str) -> int:
        if len(word) > 1 and word[0] == "t" and word[1:].isdigit():
            value = int(word[1:])
            if value < self.vocab_size:
                return value
        digest = hashlib.blake2b(word.encode("utf-8"), digest_size=8).digest()
        return int.from_bytes(digest, "big") % self.vocab_size

    def encode(self, text: str) -> list[int]:
        return [self.word_id(w) for w in text.split()]

    def token_text(self, token_id: int) -> str:
        return f" t{token_id}"

    def decode(self, token_ids: Iterable[int]) -> str:
        return "".join(self.token_text(t) for t in token_ids)

    def token_strs(self, token_ids: Sequence[int]) -> list[str]:
        return [f"t{t}" for t in token_ids]

    def apply_chat_template(self, messages: Sequence[Any]) -> str:
        """The dummy model's template: `{% for m in messages %}{{ m['content'] }} {% endfor %}`."""
        parts = []
        for message in messages:
            content = message.get("content") if isinstance(message, dict) else None
            if isinstance(content, list):  # OpenAI content parts
                content = " ".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
            parts.append(f"{content if content is not None else ''} ")
        return "".join(parts)
