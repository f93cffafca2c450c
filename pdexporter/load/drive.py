"""Send a load schedule through an `EngineDriver` at its times (real or virtual clock)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from pdexporter.client.stream import TokenStream
from pdexporter.load.mix import LoadRequest
from pdexporter.measure.driver import EngineDriver
from pdexporter.measure.prompts import TokenRange, cold_prompt

LOAD_TAG = "load"


@dataclass
class LoadResult:
    sent: int = 0
    finished: int = 0
    failed: int = 0
    prompt_tokens: int = 0
    output_tokens: int = 0
    late_s: float = 0.0  # the worst lag of a send behind its scheduled time
    open: list[TokenStream] = field(default_factory=list)

    def reap(self) -> None:
        still = []
        for s in self.open:
            if s.finished:
                self.finished += 1
                self.output_tokens += s.n_tokens
                if s.error is not None:
                    self.failed += 1
            else:
                still.append(s)
        self.open = still


async def drive(
    driver: EngineDriver,
    requests: Sequence[LoadRequest],
    *,
    token_range: TokenRange = TokenRange(),
    stop: asyncio.Event | None = None,
    on_sent: Callable[[LoadResult], None] | None = None,
    drain_s: float = 0.0,
) -> LoadResult:
    """Start each request at its time after now; then wait up to `drain_s` for the last ones."""
    result = LoadResult()
    loop = asyncio.get_running_loop()
    start = loop.time()
    for request in requests:
        if stop is not None and stop.is_set():
            break
        delay = start + request.at_s - loop.time()
        if delay > 0:
            if stop is None:
                await asyncio.sleep(delay)
            else:
                try:
                    async with asyncio.timeout(delay):
                        await stop.wait()
                    break
                except TimeoutError:
                    pass
        result.late_s = max(result.late_s, loop.time() - start - request.at_s)
        prompt = cold_prompt(request.prompt_tokens, request.salt, token_range)
        stream = driver.start(driver.prepare(prompt, request.max_tokens, LOAD_TAG))
        result.sent += 1
        result.prompt_tokens += request.prompt_tokens
        result.open.append(stream)
        if result.sent % 16 == 0:
            result.reap()
        if on_sent is not None:
            on_sent(result)
    if drain_s > 0:
        await driver.progress.wait_until(lambda: all(s.finished for s in result.open), drain_s)
    result.reap()
    return result


__all__ = ["LOAD_TAG", "LoadResult", "drive"]
