"""An engine's per-step log, the ground truth for chunking: steps as data, and the tail of a log
file read by offset.

An engine that logs its steps (vLLM with `--enable-logging-iteration-details`, SGLang with
`--decode-log-interval 1`; each line format and parser live in the engine's adapter,
`pdexporter.engines`) says per step how many prefill ("context") tokens it scheduled, so counting
steps with context tokens inside a window verifies num_chunks and each chunk's size exactly. The
elapsed time vLLM logs is *not* the step's GPU time under async scheduling (it measures the CPU
side), so we keep it only for reference. Log lines carry second-resolution wall clocks, so
windows are cut by file offset (`IterationLogTail.mark()` before, `read_since(mark)` after), not
by time.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from pdexporter.engines import IterationStep

__all__ = [
    "ChunkSummary", "IterationLogTail", "summarise_chunks",
]


@dataclass(frozen=True)
class ChunkSummary:
    """The prefill chunks seen in a window of steps."""

    num_chunks: int
    chunk_tokens: tuple[int, ...]
    decode_requests_beside: tuple[int, ...]


def summarise_chunks(steps: Iterable[IterationStep]) -> ChunkSummary:
    chunked = [s for s in steps if s.context_tokens > 0]
    return ChunkSummary(
        num_chunks=len(chunked),
        chunk_tokens=tuple(s.context_tokens for s in chunked),
        decode_requests_beside=tuple(s.generation_requests for s in chunked),
    )


class IterationLogTail:
    """Reads the step lines an engine appended to its log since a mark (a byte offset), parsed by
    the engine adapter's `parse_step_log`."""

    def __init__(self, path: str | Path, parse: Callable[[Iterable[str]], list[IterationStep]]) -> None:
        self.path = Path(path)
        self.parse = parse

    def mark(self) -> int:
        try:
            return self.path.stat().st_size
        except FileNotFoundError:
            return 0

    def read_since(self, mark: int) -> list[IterationStep]:
        try:
            with self.path.open("rb") as handle:
                handle.seek(mark)
                data = handle.read()
        except FileNotFoundError:
            return []
        return self.parse(data.decode("utf-8", "replace").splitlines())
