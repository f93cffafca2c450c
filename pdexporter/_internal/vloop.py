"""An asyncio event loop on a virtual clock: time jumps to the next timer when nothing is ready.

`VirtualEventLoop` subclasses asyncio's selector loop and wraps its selector, as the `looptime`
library does: `loop.time()` returns a virtual clock, and whenever the loop would block waiting for
a timer (no callback ready, no I/O ready), the clock jumps to that timer instead of sleeping. Real
I/O still works (the selector is polled without blocking first), so sockets and
`call_soon_threadsafe` behave; a loop with no timer and nothing ready blocks on real I/O as usual.

`asyncio.sleep`, `asyncio.wait_for` timeouts and `loop.call_at` therefore cost no wall time, and a
simulated hour of engine steps takes as long as the Python code between them. The clock starts at
0.0 and only moves forward.

    result = run_virtual(main())          # like asyncio.run(main()), on virtual time
"""

from __future__ import annotations

import asyncio
import selectors
from collections.abc import Coroutine
from typing import Any, TypeVar

__all__ = [
    "T", "VirtualEventLoop", "is_virtual", "run_virtual",
]

T = TypeVar("T")


class _JumpingSelector(selectors.BaseSelector):
    """Delegates to a real selector; a blocking select() with a timeout advances virtual time."""

    def __init__(self, real: selectors.BaseSelector, loop: VirtualEventLoop) -> None:
        self._real = real
        self._loop = loop

    def register(self, fileobj, events, data=None):
        return self._real.register(fileobj, events, data)

    def unregister(self, fileobj):
        return self._real.unregister(fileobj)

    def modify(self, fileobj, events, data=None):
        return self._real.modify(fileobj, events, data)

    def select(self, timeout: float | None = None):
        ready = self._real.select(0)
        if ready or timeout == 0:
            return ready
        if timeout is None:
            return self._real.select(None)  # no timer at all: wait for real I/O
        self._loop._advance(timeout)
        return []

    def close(self) -> None:
        self._real.close()

    def get_map(self):
        return self._real.get_map()

    def get_key(self, fileobj):
        return self._real.get_key(fileobj)


class VirtualEventLoop(asyncio.SelectorEventLoop):
    """A selector event loop whose `time()` is virtual and jumps over idle waits."""

    def __init__(self, start: float = 0.0) -> None:
        self._virtual_now = float(start)
        real = selectors.DefaultSelector()
        super().__init__(_JumpingSelector(real, self))
        self._clock_resolution = 1e-9

    def time(self) -> float:
        return self._virtual_now

    def _advance(self, seconds: float) -> None:
        if seconds > 0:
            # Land exactly on the earliest timer, not a rounding error before it.
            # BaseEventLoop's timer heap: private, so not in typeshed
            if self._scheduled:  # type: ignore[attr-defined]
                when = self._scheduled[0].when()  # type: ignore[attr-defined]
                self._virtual_now = max(self._virtual_now, when if when <= self._virtual_now + seconds else
                                        self._virtual_now + seconds)
            else:
                self._virtual_now += seconds

    @property
    def is_virtual(self) -> bool:
        return True


def is_virtual(loop: asyncio.AbstractEventLoop | None = None) -> bool:
    loop = loop or asyncio.get_running_loop()
    return isinstance(loop, VirtualEventLoop)


def run_virtual(coro: Coroutine[Any, Any, T], *, debug: bool | None = None) -> T:
    """Run a coroutine to completion on a fresh `VirtualEventLoop` (cf. `asyncio.run`)."""
    with asyncio.Runner(debug=debug, loop_factory=VirtualEventLoop) as runner:
        return runner.run(coro)
