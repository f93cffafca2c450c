"""Overlapped starts on one GPU: two gated local launchers, ports apart, taking turns.

vLLM's start on an H200 is ~50 s of CPU work before it touches the GPU (imports, argument and
model-config parsing, the tokenizer, the engine-core process: `results/h200-vllm0.22-qwen3-coder-
30b-a3b-starts/RUN.md`) and ~35 s on it (weights, torch.compile from its cache, memory profiling,
CUDA-graph capture). A sweep relaunches the engine per chunk size, so the CPU part of every start
after the first can run while the engine before it still serves. `OverlappingLauncher` does that
with two `LocalLauncher`s (`gated`): the sweep calls `prepare(next chunk)` as it starts a chunk
size; the other lane launches that engine behind its start gate (`_internal.gate`: held at its
first CUDA initialisation), so nothing of it touches the GPU; `start(next chunk)`, once the sweep
has stopped the engine in use, opens the gate. The flags being measured are the same; only the
port differs (`{port}`: base_port and base_port + 1), and a port is a placement flag that
records may differ in (`measure.point.flag_mismatch`).

vLLM's API server waits `VLLM_ENGINE_READY_TIMEOUT_S` (600 s in 0.22) for its engine core, so an
engine held longer than that exits; its turn then starts it again, in full (`LocalLauncher.start`
sees it gone). That variable is not set for it: vLLM hashes it into the torch.compile cache key.

Held engines follow the local launcher's rules: a sweep stopped at its deadline releases both
(the next invocation adopts the one it wants, held or serving); a held engine of another chunk
size stays, using no GPU, until its own turn; one that serves is stopped before another goes
through its gate.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from pdexporter.launch.base import EngineHandle
from pdexporter.launch.local import LocalLauncher

__all__ = ["OverlappingLauncher"]


@dataclass
class OverlappingLauncher:
    lanes: tuple[LocalLauncher, LocalLauncher]
    name: str = "local"
    _current: LocalLauncher | None = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        if not all(lane.gated for lane in self.lanes) or self.lanes[0].url == self.lanes[1].url:
            raise ValueError("overlapped starts need two gated local launchers on different urls")

    @property
    def can_set_chunk_size(self) -> bool:
        return True

    @property
    def adopted(self) -> bool:
        return self._current is not None and self._current.adopted

    def can_adopt(self, chunk_size: int) -> bool:
        return any(lane.can_adopt(chunk_size) for lane in self.lanes)

    def _lane_for(self, chunk_size: int) -> LocalLauncher:
        """The lane holding (or able to adopt) this chunk size's engine, else one not holding another's."""
        for lane in self.lanes:
            if lane.holds(chunk_size):
                return lane
        for lane in self.lanes:
            if lane.can_adopt(chunk_size):
                return lane
        idle = sorted((lane for lane in self.lanes if lane.idle), key=lambda lane: lane.url_taken(chunk_size))
        return idle[0] if idle else self.lanes[0]

    async def start(self, chunk_size: int) -> EngineHandle:
        lane = self._lane_for(chunk_size)
        handle = await lane.start(chunk_size)
        self._current = lane
        return handle

    async def prepare(self, chunk_size: int) -> None:
        """Start the engine of a chunk size to come in a lane not in use, held before the GPU (or
        take over the one an earlier invocation left for it)."""
        if any(lane.holds(chunk_size) for lane in self.lanes):
            return
        idle = [lane for lane in self.lanes if lane is not self._current and lane.idle]
        ready = [lane for lane in idle if lane.can_adopt(chunk_size)] or [
            lane for lane in idle if not lane.url_taken(chunk_size)]
        if ready:  # else both ports serve other chunk sizes: nothing is started early
            await ready[0].prepare(chunk_size)

    async def prestart(self, chunk_size: int) -> None:
        lane = self._lane_for(chunk_size)
        await lane.prestart(chunk_size)

    async def stop(self) -> None:
        """Stop the engine in use; one held for a chunk size to come stays held."""
        current, self._current = self._current, None
        if current is not None:
            await current.stop()

    def release(self) -> None:
        for lane in self.lanes:
            lane.release()
        self._current = None
