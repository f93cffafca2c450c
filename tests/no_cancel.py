"""NoCancelDriver: a TEST DOUBLE around an engine driver that hides its `cancel`, so fast mode
lets used probe sets decode their leftover tokens, as it did before it could cancel them. Used to
show that cancelling changes no number (tests) and what it saves (benchmarks)."""

from __future__ import annotations

from dataclasses import dataclass

from pdexporter.client.stream import TokenStream
from pdexporter.measure.driver import EngineDriver
from pdexporter.sweep.providers import VirtualSimProvider


@dataclass
class NoCancelDriver:
    """A TEST DOUBLE around the embedded engine's driver: the same engine, but a driver that cannot
    cancel streams (as before the speed-up), so fast mode lets used probe sets run out."""

    inner: EngineDriver

    def __getattr__(self, name: str):  # type: ignore[no-untyped-def]
        if name == "cancel":
            raise AttributeError(name)
        return getattr(self.inner, name)

    @property
    def info(self):  # type: ignore[no-untyped-def]
        return self.inner.info

    @property
    def progress(self):  # type: ignore[no-untyped-def]
        return self.inner.progress

    def now_ns(self) -> int:
        return self.inner.now_ns()

    def prepare(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        return self.inner.prepare(*args, **kwargs)

    def start(self, prepared, *, retry_connect: bool = False) -> TokenStream:  # type: ignore[no-untyped-def]
        return self.inner.start(prepared, retry_connect=retry_connect)

    async def scrape_metrics(self):  # type: ignore[no-untyped-def]
        return await self.inner.scrape_metrics()

    def step_mark(self):  # type: ignore[no-untyped-def]
        return self.inner.step_mark()

    def steps_since(self, mark):  # type: ignore[no-untyped-def]
        return self.inner.steps_since(mark)

    async def aclose(self) -> None:
        await self.inner.aclose()


class NoCancelProvider(VirtualSimProvider):
    async def open(self, chunk_size: int) -> EngineDriver:
        return NoCancelDriver(await super().open(chunk_size))  # type: ignore[return-value]
