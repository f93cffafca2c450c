"""vLLM's per-step log (`--enable-logging-iteration-details`): the ground truth for chunking.

Each engine step logs one line:

    Iteration(N): a context requests, b context tokens, c generation requests, d generation tokens,
    iteration elapsed time: t ms[, GPU KV cache usage: u%]

"context tokens" is the prefill chunk scheduled in that step, so counting steps with context
tokens inside a window verifies num_chunks and each chunk's size exactly. The elapsed time is
*not* the step's GPU time under async scheduling (it measures the CPU side), so we keep it only
for reference. Log lines carry second-resolution wall clocks, so windows are cut by file offset
(`IterationLogTail.mark()` before, `read_since(mark)` after), not by time.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

ITERATION_RE = re.compile(
    r"Iteration\((?P<iteration>\d+)\):\s+"
    r"(?P<ctx_req>\d+)\s+context requests,\s+"
    r"(?P<ctx_tok>\d+)\s+context tokens,\s+"
    r"(?P<gen_req>\d+)\s+generation requests,\s+"
    r"(?P<gen_tok>\d+)\s+generation tokens,\s+"
    r"iteration elapsed time:\s+(?P<elapsed>[0-9.]+)\s*ms"
)


@dataclass(frozen=True, slots=True)
class IterationStep:
    iteration: int
    context_requests: int
    context_tokens: int
    generation_requests: int
    generation_tokens: int
    elapsed_ms: float

    @property
    def is_mixed(self) -> bool:
        return self.context_tokens > 0 and self.generation_requests > 0

    def to_log_line(self) -> str:
        """The line vLLM would print for this step (the embedded engine logs the same)."""
        return (
            f"Iteration({self.iteration}): {self.context_requests} context requests, "
            f"{self.context_tokens} context tokens, {self.generation_requests} generation requests, "
            f"{self.generation_tokens} generation tokens, iteration elapsed time: {self.elapsed_ms:.2f} ms"
        )


def parse_iteration_lines(lines: Iterable[str]) -> list[IterationStep]:
    steps = []
    for line in lines:
        match = ITERATION_RE.search(line)
        if match:
            steps.append(
                IterationStep(
                    iteration=int(match["iteration"]),
                    context_requests=int(match["ctx_req"]),
                    context_tokens=int(match["ctx_tok"]),
                    generation_requests=int(match["gen_req"]),
                    generation_tokens=int(match["gen_tok"]),
                    elapsed_ms=float(match["elapsed"]),
                )
            )
    return steps


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
    """Reads the iteration lines an engine appended to its log since a mark (a byte offset)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)

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
        return parse_iteration_lines(data.decode("utf-8", "replace").splitlines())
