"""A P/D pair on one host: two engines (a prefill and a decode instance) started, health-waited,
adopted, released and stopped together (docs/disaggregation.md).

Each instance is a launcher of its own (`LocalLauncher` with `role` "prefill" / "decode": its
state and log in `{chunk}/engine/{role}/`, its own command and environment, its process group
stopped by `base.terminate_group`; or a real-time `SimLauncher` with `kv_role`). `PairLauncher`
is a `Launcher` whose handle is the decode instance's (the probes run there); the prefill
instance's handle is `prefill_handle`. What a pair's two command lines must agree on (one KV
connector, distinct ports, GPUs and side-channel ports) is the disaggregation adapter's rule:
`engines.disagg.check_pair`, applied when the sweep file is read.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from pdexporter.launch.base import Adopting, EngineHandle, Launcher, Prestarting, Releasing


@dataclass
class PairLauncher:
    """Two launchers as one: `start` brings both up (concurrently) at the decode instance's chunk
    size and returns the decode handle; every other verb goes to both."""

    prefill: Launcher
    decode: Launcher
    prefill_chunk_size: int | None = None  # None: the same as the decode instance's
    name: str = "pair"
    prefill_handle: EngineHandle | None = field(default=None, init=False)

    @property
    def can_set_chunk_size(self) -> bool:
        return self.decode.can_set_chunk_size

    @property
    def adopted(self) -> bool:
        return all(isinstance(x, Adopting) and x.adopted for x in (self.prefill, self.decode))

    def can_adopt(self, chunk_size: int) -> bool:
        return all(isinstance(x, Adopting) and x.can_adopt(c)
                   for x, c in ((self.prefill, self.prefill_chunk_size or chunk_size), (self.decode, chunk_size)))

    async def start(self, chunk_size: int) -> EngineHandle:
        prefill, decode = await asyncio.gather(
            self.prefill.start(self.prefill_chunk_size or chunk_size), self.decode.start(chunk_size),
            return_exceptions=True)
        for result in (prefill, decode):
            if isinstance(result, BaseException):
                await self.stop()
                raise result
        assert isinstance(prefill, EngineHandle) and isinstance(decode, EngineHandle)
        self.prefill_handle = prefill
        return decode

    async def prestart(self, chunk_size: int) -> None:
        for launcher, chunk in ((self.prefill, self.prefill_chunk_size or chunk_size), (self.decode, chunk_size)):
            if isinstance(launcher, Prestarting):
                await launcher.prestart(chunk)

    async def stop(self) -> None:
        self.prefill_handle = None
        await asyncio.gather(self.prefill.stop(), self.decode.stop())

    def release(self) -> None:
        for launcher in (self.prefill, self.decode):
            if isinstance(launcher, Releasing):
                launcher.release()


__all__ = ["PairLauncher"]
