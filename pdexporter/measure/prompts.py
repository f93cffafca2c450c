"""Prompts as token ids, so the engine computes exactly the tokens we mean. Pure.

Probes share one fixed 4096-token prompt: after one warm-up request it sits in the prefix cache,
and a new probe computes only its final partial block, joining the running batch at once.
Injected prefills are random ids from a per-run salt: no block of theirs was ever cached, so
the engine computes all P tokens.
"""

from __future__ import annotations

import functools
import hashlib
import random
from dataclasses import dataclass

import numpy as np

__all__ = [
    "SHARED_PREFIX_SEED", "TokenRange", "cold_prompt", "shared_prefix",
]


@dataclass(frozen=True)
class TokenRange:
    """Ids to draw from: clear of special tokens at either end of common vocabularies."""

    low: int = 1000
    high: int = 100_000

    def __post_init__(self) -> None:
        if not 0 <= self.low < self.high:
            raise ValueError(f"token range [{self.low}, {self.high}) is empty")


SHARED_PREFIX_SEED = 0x5EED_4096


@functools.lru_cache(maxsize=16)
def shared_prefix(n_tokens: int, token_range: TokenRange = TokenRange()) -> tuple[int, ...]:
    """The probes' common context: the same ids on every call, every machine (and the same tuple
    object within a process, so an in-process engine hashes its blocks once)."""
    rng = random.Random(SHARED_PREFIX_SEED)
    return tuple(rng.randrange(token_range.low, token_range.high) for _ in range(n_tokens))


def cold_prompt(n_tokens: int, salt: str, token_range: TokenRange = TokenRange()) -> tuple[int, ...]:
    """P ids that no earlier prompt shares: the salt (a UUID per run) seeds the generator.

    numpy's legacy RandomState stream is frozen across numpy versions, so a salt gives the same ids
    everywhere; it draws 32K ids in well under a millisecond (Python's randrange took ~20 ms, which
    a virtual-time sweep pays 980 times).
    """
    if n_tokens < 1:
        raise ValueError(f"a prefill needs at least 1 token, got {n_tokens}")
    digest = hashlib.sha256(salt.encode("utf-8")).digest()
    rng = np.random.RandomState(np.frombuffer(digest[:8], dtype=np.uint32))
    return tuple(rng.randint(token_range.low, token_range.high, size=n_tokens, dtype=np.int64).tolist())
