"""Providers: what the sweep controller asks for an engine at a chunk size, as a ready
`EngineDriver` (an HTTP driver on a launched engine, or the embedded engine in-process on a
virtual clock), and `make_providers`, which builds one per engine slot (one per GPU of
`launcher.gpus`, one per embedded engine of `launcher.engines`, else one) from a sweep file's
`launcher`."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from pdexporter.errors import ConfigError
from pdexporter.launch.base import Launcher, LogDirected, Releasing
from pdexporter.launch.external import ExternalLauncher
from pdexporter.launch.kubernetes import KubernetesLauncher
from pdexporter.launch.local import LocalLauncher
from pdexporter.launch.sim import SimLauncher
from pdexporter.measure.driver import EngineDriver, http_driver
from pdexporter.measure.store import ResultsStore
from pdexporter.sweep.spec import (
    ExternalLauncherSpec,
    KubernetesLauncherSpec,
    LocalLauncherSpec,
    SimLauncherSpec,
    SweepSpec,
)

# ---------------------------------------------------------------------------------------------
# Providers: a driver per chunk size


class EngineProvider(Protocol):
    """What the controller needs: a driver on an engine running at a chunk size."""

    description: str
    launcher: Launcher | None  # the launcher behind the drivers, if any (its capabilities matter)

    async def open(self, chunk_size: int) -> EngineDriver: ...

    async def close(self, *, stop_engine: bool) -> None:
        """Close the driver; stop the engine, or (stop_engine=False) leave it for a later run."""
        ...


@runtime_checkable
class SlotLabelled(Protocol):
    """A provider that is one of several engine slots of a sweep (a GPU of `launcher.gpus`)."""

    slot: str  # "GPU 1", "engine 0"; "" for a sweep of one engine


def slot_label(provider: EngineProvider) -> str:
    return provider.slot if isinstance(provider, SlotLabelled) else ""


@dataclass
class LauncherProvider:
    """HTTP drivers on engines from a `Launcher` (local, external, sim real-time, kubernetes)."""

    launcher: Launcher
    model: str | None = None
    api_key: str | None = None
    gpu: str | None = None
    description: str = ""
    log_dir_for: Callable[[int], Path] | None = None  # where a launcher with a `log_dir` logs
    slot: str = ""
    _stack: contextlib.AsyncExitStack | None = field(default=None, init=False, repr=False)

    async def open(self, chunk_size: int) -> EngineDriver:
        await self._close_driver()
        if self.log_dir_for is not None and isinstance(self.launcher, LogDirected):
            self.launcher.log_dir = self.log_dir_for(chunk_size)
        handle = await self.launcher.start(chunk_size)
        stack = contextlib.AsyncExitStack()
        try:
            driver = await stack.enter_async_context(http_driver(handle, model=self.model, api_key=self.api_key, gpu=self.gpu))
        except BaseException:
            await stack.aclose()
            raise
        self._stack = stack
        return driver

    async def _close_driver(self) -> None:
        stack, self._stack = self._stack, None
        if stack is not None:
            await stack.aclose()

    async def close(self, *, stop_engine: bool) -> None:
        await self._close_driver()
        if not stop_engine and isinstance(self.launcher, Releasing):
            self.launcher.release()
        else:
            await self.launcher.stop()


@dataclass
class VirtualSimProvider:
    """The embedded engine in-process on a virtual clock (run the controller under `run_virtual`)."""

    profile: Any  # a profile name, path or `sim.profile.Profile`
    model: str | None = None
    gpu: str | None = None
    description: str = ""
    launcher: Launcher | None = None  # in-process: nothing to launch
    slot: str = ""
    _driver: Any = field(default=None, init=False, repr=False)

    async def open(self, chunk_size: int) -> EngineDriver:
        from pdexporter.sim.driver import SimDriver  # the embedded engine (sim package)

        await self.close(stop_engine=True)
        self._driver = SimDriver.create(profile=self.profile, chunk_size=chunk_size)
        return self._driver

    async def close(self, *, stop_engine: bool) -> None:
        driver, self._driver = self._driver, None
        if driver is not None:
            await driver.aclose()


def make_provider(
    spec: SweepSpec,
    store: ResultsStore,
    *,
    api_key: str | None = None,
    deadline: Callable[[], float | None] = lambda: None,
    on_message: Callable[[str], None] = lambda text: None,
) -> EngineProvider:
    """The one provider of a sweep file of one engine (`make_providers` for several)."""
    providers = make_providers(spec, store, api_key=api_key, deadline=deadline, on_message=on_message)
    if len(providers) != 1:
        raise ConfigError(f"launcher: {len(providers)} engines (gpus/engines); use make_providers")
    return providers[0]


def make_providers(
    spec: SweepSpec,
    store: ResultsStore,
    *,
    api_key: str | None = None,
    deadline: Callable[[], float | None] = lambda: None,
    on_message: Callable[[str], None] = lambda text: None,
) -> list[EngineProvider]:
    """One provider per engine slot of the sweep file's launcher (`SweepSpec.slots`)."""
    launcher_spec = spec.launcher
    if isinstance(launcher_spec, SimLauncherSpec):
        several = launcher_spec.engines > 1
        if launcher_spec.clock == "virtual":
            return [VirtualSimProvider(launcher_spec.profile, model=spec.model, gpu=spec.gpu,
                                       slot=f"engine {i}" if several else "",
                                       description=f"embedded engine {launcher_spec.profile}, virtual clock")
                    for i in range(launcher_spec.engines)]
        return [LauncherProvider(SimLauncher(profile=launcher_spec.profile), model=spec.model, api_key=api_key,
                                 gpu=None, log_dir_for=store.engine_dir, slot=f"engine {i}" if several else "",
                                 description=f"embedded engine {launcher_spec.profile}, real time over HTTP")
                for i in range(launcher_spec.engines)]
    if isinstance(launcher_spec, LocalLauncherSpec):
        urls = [launcher_spec.slot_url(i) for i in range(launcher_spec.slots)]
        out: list[EngineProvider] = []
        for i, url in enumerate(urls):
            launcher = LocalLauncher(
                command=launcher_spec.command, store=store, url=url,
                variables={**launcher_spec.vars, **launcher_spec.slot_values(i)},
                env=launcher_spec.slot_env(i), cwd=launcher_spec.cwd, health_timeout_s=launcher_spec.health_timeout_s,
                stop_timeout_s=launcher_spec.stop_timeout_s, adopt=launcher_spec.adopt, gpu=spec.gpu,
                deadline=deadline, on_message=on_message, siblings=frozenset(urls) - {url},
            )
            slot = f"GPU {launcher_spec.gpus[i]}" if launcher_spec.gpus else ""
            out.append(LauncherProvider(launcher, model=spec.model, api_key=api_key, gpu=spec.gpu, slot=slot,
                                        description=f"local engine at {url}" + (f" on {slot}" if slot else "")))
        return out
    launcher: Launcher
    if isinstance(launcher_spec, ExternalLauncherSpec):
        launcher = ExternalLauncher(url=launcher_spec.url, chunk_size=launcher_spec.chunk_size, gpu=spec.gpu)
        what = f"external engine at {launcher_spec.url}"
    elif isinstance(launcher_spec, KubernetesLauncherSpec):
        launcher = KubernetesLauncher(launcher_spec, gpu=spec.gpu, on_message=on_message)
        what = f"Kubernetes ({launcher_spec.tool}) engine at {launcher_spec.url}"
    else:  # pragma: no cover - the schema admits no other kind
        raise ConfigError(f"launcher.kind: {launcher_spec!r}")
    return [LauncherProvider(launcher, model=spec.model, api_key=api_key, gpu=spec.gpu, description=what)]
