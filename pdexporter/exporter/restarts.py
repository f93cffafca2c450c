"""An engine that restarts under a running exporter (issue 24's audit: a vLLM restarted with another
`--max-num-batched-tokens` went on being recorded under the old chunk size, its windows "confirmed").

The scraper sees the restart (`client.metrics.engine_restarted`: the process start time moved, or a
counter the engine keeps from its start fell); the engine is then asked who it is again, as at the
start (`measure.driver.describe_engine`), and no window starts until it answered:

- the same engine (kind, model, version, context limit; the chunk size where it publishes it): the
  exporter goes on, and says what it could not check (vLLM publishes no chunk size: each window's
  cadence check is then the only witness of a changed `--max-num-batched-tokens`);
- the same engine with another chunk size it publishes (SGLang restarted with another
  `--chunked-prefill-size`), where the run took its chunk size from the engine (none given): the
  windows go on under the new size (`adopt`: the runner's records, schedule and `engine_info`), as
  they would have had the exporter started now;
- another engine: the run ends with one line (`EngineChanged`, exit 3) rather than recording the new
  engine under the old one's name, chunk size and records (a supervisor restarting the exporter gets
  a fresh identification).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from pdexporter.client.client import EngineClient
from pdexporter.errors import ConfigError, EngineChanged, EngineError
from pdexporter.launch import EngineHandle
from pdexporter.measure.driver import EngineInfo, describe_engine

__all__ = ["EngineRestarts"]

ASK_BACKOFF_S = (0.5, 1.0, 2.0, 4.0, 8.0)  # between tries while the restarted engine warms up (then 8 s)


class EngineRestarts:
    """The runner's view of engine restarts: `seen` from the scraper, `asking` while the engine is
    asked who it is (no window starts meanwhile), `changed` once it answered as another engine."""

    def __init__(self, handle: EngineHandle, info: Callable[[], EngineInfo], *, model: str | None,
                 api_key: str | None, chunk_note: Callable[[], str], log: Callable[[str], None],
                 count: Callable[[], None], adopt: Callable[[EngineInfo], str | None] | None = None) -> None:
        # `info` and `chunk_note` read the runner's own (one owner: a chunk size it adopts is seen here at once)
        self.handle, self.info, self.model, self.api_key = handle, info, model, api_key
        self.chunk_note = chunk_note  # e.g. "8192 (given)": what windows are recorded under
        self.log, self.count = log, count
        # the windows go on under a new published chunk size, the runner's info and settings updated
        # (None: it ends the run); says why it cannot
        self.adopt = adopt
        self.changed: EngineChanged | None = None
        self.seen_count = 0  # restarts seen so far: a window across which it moved is dropped (`Runner._window`)
        self._task: asyncio.Task[None] | None = None

    @property
    def asking(self) -> bool:
        return self._task is not None and not self._task.done()

    def seen(self, why: str) -> None:
        """The scraper saw a restart (`why`): ask the engine again, unless already asking."""
        self.count()
        self.seen_count += 1
        self._ask_again(f"restarted ({why})")

    def back(self, why: str) -> None:
        """The engine answers again after an outage (`why`), with no sign it restarted: ask it who it
        is all the same (a restart may leave none), without counting a restart."""
        self._ask_again(why)

    def _ask_again(self, what: str) -> None:
        """Ask the engine who it is (no window until it answers), unless already asking."""
        if self.asking:
            return
        self.log(f"the engine {what}: asking it who it is again; no window until it answers")
        self._task = asyncio.create_task(self._ask(), name="pdexporter-reidentify")

    async def aclose(self) -> None:
        """Stop asking (the exporter shuts down)."""
        if self._task is not None and not self._task.done():
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    async def _ask(self) -> None:
        tries = 0
        while True:
            client = EngineClient(self.handle.url, api_key=self.api_key)
            try:
                now = await describe_engine(client, self.handle, model=self.model)
                break
            except ConfigError as exc:  # it answers, but not as the engine given (model, chunk size, kind)
                self.changed = EngineChanged(f"the engine restarted: {exc}")
                return
            except EngineError:  # not ready yet: ask again
                await asyncio.sleep(ASK_BACKOFF_S[min(tries, len(ASK_BACKOFF_S) - 1)])
                tries += 1
            finally:
                await client.aclose()
        self._settle(now)

    def _settle(self, now: EngineInfo) -> None:
        info = self.info()
        change = info.changed_to(now)
        if change is not None and self.adopt is not None and info.changed_to(now, chunk_size=False) is None:
            refused = self.adopt(now)
            if refused is None:
                self.log(f"the engine restarted with another chunk size ({change}, as it publishes it): windows go "
                         f"on under {now.chunk_size}")
                return
            change = f"{change}; {refused}"
        if change is not None:
            self.changed = EngineChanged(
                f"{info.url}: the engine restarted as another engine ({change}); its windows would be "
                "recorded under the old one's name and settings, so the run ends: start pdexporter again "
                "(with --out, another directory)")
            return
        unchecked = ("" if now.chunk_size_published else
                     f"; it publishes no chunk size, so windows go on under chunk size {self.chunk_note()}, each "
                     "checking it against the probes' cadence (a changed --max-num-batched-tokens shows there only)")
        self.log(f"the engine answers as before ({now.kind} {now.version or ''} serving {now.model}){unchecked}"
                 .replace("  ", " "))
