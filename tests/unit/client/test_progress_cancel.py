"""`Progress.wait_until` passes a cancel on, even one that arrives as its wait ends.

Python 3.11's `asyncio.wait_for` returns the result instead of raising when the task is
cancelled in the loop iteration its inner wait finished in. Every window waits through
`wait_until` many times a second, so a Ctrl-C that met a token could be lost and `measure` would
go on with all its repetitions: the likely cause of `measure` ignoring SIGINT for 60 s in one of
three CI runs beside CPU burners. The code now uses `asyncio.timeout`, which has no inner task."""

from __future__ import annotations

import asyncio

import pytest

from pdexporter.client.stream import Progress


@pytest.mark.parametrize("timeout_s", [None, 10.0])
def test_a_cancel_in_the_iteration_the_wait_ends_is_not_lost(timeout_s: float | None) -> None:
    async def main() -> str:
        progress = Progress()
        ready = False

        async def waiter() -> str:
            await progress.wait_until(lambda: ready, timeout_s)
            return "went on"

        task = asyncio.create_task(waiter())
        await asyncio.sleep(0)  # the waiter is blocked on the event
        ready = True
        progress.notify()  # its wait ends in the next iteration ...
        task.cancel()  # ... which also delivers the cancel
        try:
            return await task
        except asyncio.CancelledError:
            return "cancelled"

    assert asyncio.run(main()) == "cancelled"


def test_wait_until_still_times_out_and_returns_the_predicate() -> None:
    async def main() -> tuple[bool, bool]:
        progress = Progress()
        return await progress.wait_until(lambda: False, 0.01), await progress.wait_until(lambda: True, 0.01)

    assert asyncio.run(main()) == (False, True)
