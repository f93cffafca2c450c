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

from pdexporter.engines import DECODE_BENCH, DEFAULT_CHUNK_SIZE, DEFAULT_ENGINE, IMITATED, connector_of, pair_connector
from pdexporter.errors import ConfigError
from pdexporter.launch.base import EngineHandle, Launcher, LogDirected, Releasing
from pdexporter.launch.external import ExternalLauncher
from pdexporter.launch.kubernetes import KubernetesLauncher
from pdexporter.launch.local import LocalLauncher
from pdexporter.launch.overlap import OverlappingLauncher
from pdexporter.launch.pair import PairLauncher
from pdexporter.launch.sim import SimLauncher
from pdexporter.launch.specs import (
    ExternalLauncherSpec,
    KubernetesLauncherSpec,
    LocalLauncherSpec,
    PairLauncherSpec,
    SimLauncherSpec,
)
from pdexporter.measure.driver import EngineDriver, http_driver
from pdexporter.measure.store import ResultsStore
from pdexporter.sweep.spec import SweepSpec

__all__ = [
    "EngineProvider", "LauncherProvider", "PairProvider", "SlotLabelled", "VirtualSimProvider", "make_provider",
    "make_providers", "sim_imitation_for", "sim_role_for", "slot_label",
]

# ---------------------------------------------------------------------------------------------
# Providers: a driver per chunk size


class EngineProvider(Protocol):
    """What the controller needs: a driver on an engine running at a chunk size."""

    description: str

    @property
    def launcher(self) -> Launcher | None:  # the launcher behind the drivers, if any (its capabilities matter)
        ...

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


@dataclass(kw_only=True)
class _LaunchedProvider:
    """An engine launched per chunk size and a driver on it, held open until the next `open` or
    `close`. A subclass declares `launcher` (positional) and makes the driver."""

    launcher: Any
    model: str | None = None
    api_key: str | None = None
    gpu: str | None = None
    description: str = ""
    log_dir_for: Callable[[int], Path] | None = None  # where a launcher with a `log_dir` logs
    slot: str = ""
    read_timeout_s: float | None = None  # the client's read timeout (`--read-timeout`)
    _stack: contextlib.AsyncExitStack | None = field(default=None, init=False, repr=False)

    def _direct_logs(self, log_dir: Path) -> None:
        raise NotImplementedError

    def _driver(self, handle: EngineHandle) -> contextlib.AbstractAsyncContextManager[EngineDriver]:
        raise NotImplementedError

    async def open(self, chunk_size: int) -> EngineDriver:
        await self._close_driver()
        if self.log_dir_for is not None:
            self._direct_logs(self.log_dir_for(chunk_size))
        handle = await self.launcher.start(chunk_size)
        stack = contextlib.AsyncExitStack()
        try:
            driver = await stack.enter_async_context(self._driver(handle))
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
class LauncherProvider(_LaunchedProvider):
    """HTTP drivers on engines from a `Launcher` (local, external, sim real-time, kubernetes)."""

    launcher: Launcher

    def _direct_logs(self, log_dir: Path) -> None:
        if isinstance(self.launcher, LogDirected):
            self.launcher.log_dir = log_dir

    def _driver(self, handle: EngineHandle) -> contextlib.AbstractAsyncContextManager[EngineDriver]:
        return http_driver(handle, model=self.model, api_key=self.api_key, gpu=self.gpu,
                           read_timeout_s=self.read_timeout_s)


@dataclass
class PairProvider(_LaunchedProvider):
    """`measure.pd.PdDriver`s on a P/D pair from a `PairLauncher` (docs/disaggregation.md); the
    real-time embedded engines log under {chunk}/engine/{role}."""

    launcher: PairLauncher
    connector: str = "NixlConnector"
    p2p_addresses: tuple[str, str] | None = None

    def _direct_logs(self, log_dir: Path) -> None:
        for role, launcher in (("prefill", self.launcher.prefill), ("decode", self.launcher.decode)):
            if isinstance(launcher, LogDirected):
                launcher.log_dir = log_dir / role

    def _driver(self, handle: EngineHandle) -> contextlib.AbstractAsyncContextManager[EngineDriver]:
        from pdexporter.measure.pd import pd_driver

        assert self.launcher.prefill_handle is not None
        return pd_driver(self.launcher.prefill_handle, handle, model=self.model, api_key=self.api_key, gpu=self.gpu,
                         connector=self.connector, p2p_addresses=self.p2p_addresses, read_timeout_s=self.read_timeout_s)


@dataclass
class VirtualSimProvider:
    """The embedded engine in-process on a virtual clock (run the controller under `run_virtual`);
    `kv_role` "decode-bench" (one engine) or "pd" (a prefill and a decode engine behind
    `measure.pd.PdDriver`) measures the offloaded arm."""

    profile: Any  # a profile name, path or `sim.profile.Profile`
    model: str | None = None
    gpu: str | None = None
    description: str = ""
    launcher: Launcher | None = None  # in-process: nothing to launch
    kv_role: str = "none"
    slot: str = ""
    imitates: str = DEFAULT_ENGINE  # the engine (setup) it imitates (`engines.IMITATED`)
    _driver: Any = field(default=None, init=False, repr=False)

    async def open(self, chunk_size: int) -> EngineDriver:
        from pdexporter.measure.sim_driver import SimDriver  # the embedded engine (sim package)

        await self.close(stop_engine=True)
        if self.kv_role == "pd":
            from pdexporter.measure.pd import PdDriver

            self._driver = PdDriver(SimDriver.create(profile=self.profile, chunk_size=chunk_size, kv_role="prefill"),
                                    SimDriver.create(profile=self.profile, chunk_size=chunk_size, kv_role="decode"))
        else:
            self._driver = SimDriver.create(profile=self.profile, chunk_size=chunk_size, kv_role=self.kv_role,
                                            imitates=self.imitates)
        return self._driver

    async def close(self, *, stop_engine: bool) -> None:
        driver, self._driver = self._driver, None
        if driver is not None:
            await driver.aclose()


def sim_role_for(launcher_spec: Any) -> str:
    """The embedded engine's `kv_role` that models a sweep file's engine setup: "pd" for a pair,
    "decode-bench" for a command with DecodeBenchConnector, the sim launcher's own, else "none"."""
    from pdexporter.launch.local import render_command

    if isinstance(launcher_spec, PairLauncherSpec):
        return "pd"
    if isinstance(launcher_spec, SimLauncherSpec):
        return launcher_spec.kv_role
    if isinstance(launcher_spec, LocalLauncherSpec):
        try:
            argv = render_command(launcher_spec.command, DEFAULT_CHUNK_SIZE, dict(launcher_spec.vars)).argv
        except ConfigError:
            return "none"
        return "decode-bench" if connector_of(argv) == DECODE_BENCH else "none"
    return "none"


def sim_imitation_for(launcher_spec: Any) -> str:
    """The engine (setup) the embedded engine imitates to model a sweep file's engine: the sim
    launcher's own, SGLang's mode for a local SGLang command, else vLLM."""
    if isinstance(launcher_spec, SimLauncherSpec):
        return launcher_spec.engine
    engine = (
        launcher_spec.setup if isinstance(launcher_spec, LocalLauncherSpec) else getattr(launcher_spec, "engine", None)
    )
    return engine if engine in IMITATED else DEFAULT_ENGINE


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


def _overlapping(spec: SweepSpec, launcher_spec: LocalLauncherSpec, store: ResultsStore, api_key: str | None,
                 deadline: Callable[[], float | None], on_message: Callable[[str], None]) -> EngineProvider:
    """One GPU, two gated local launchers taking turns (`launch.overlap`)."""
    urls = [launcher_spec.url.replace("{port}", launcher_spec.lane_values(i)["port"]) for i in (0, 1)]
    lanes = tuple(
        LocalLauncher(
            command=launcher_spec.command, store=store, url=url,
            variables={**launcher_spec.vars, **launcher_spec.lane_values(i)}, env=dict(launcher_spec.env),
            cwd=launcher_spec.cwd, health_timeout_s=launcher_spec.health_timeout_s,
            stop_timeout_s=launcher_spec.stop_timeout_s, adopt=launcher_spec.adopt, gpu=spec.gpu, deadline=deadline,
            on_message=on_message, siblings=frozenset(urls) - {url}, engine=launcher_spec.engine, gated=True,
        )
        for i, url in enumerate(urls)
    )
    return LauncherProvider(OverlappingLauncher((lanes[0], lanes[1])), model=spec.model, api_key=api_key, gpu=spec.gpu,
                            read_timeout_s=spec.read_timeout_s,
                            description=f"local engines at {urls[0]} and {urls[1]}, each started while the other "
                                        "serves (held before the GPU)")


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
        role = launcher_spec.kv_role
        arm = "" if role == "none" else f", offloaded arm ({role})"
        arm += "" if launcher_spec.engine == DEFAULT_ENGINE else f", imitating {launcher_spec.engine}"
        several = launcher_spec.engines > 1

        def slot(i: int) -> str:
            return f"engine {i}" if several else ""

        if launcher_spec.clock == "virtual":
            return [
                VirtualSimProvider(
                    launcher_spec.profile,
                    model=spec.model,
                    gpu=spec.gpu,
                    kv_role=role,
                    slot=slot(i),
                    imitates=launcher_spec.engine,
                    description=f"embedded engine {launcher_spec.profile}, virtual clock{arm}",
                )
                for i in range(launcher_spec.engines)
            ]
        if role == "pd":
            return [PairProvider(PairLauncher(SimLauncher(profile=launcher_spec.profile, kv_role="prefill"),
                                              SimLauncher(profile=launcher_spec.profile, kv_role="decode")),
                                 model=spec.model, api_key=api_key, log_dir_for=store.engine_dir, slot=slot(i),
                                 read_timeout_s=spec.read_timeout_s,
                                 description=f"embedded engines {launcher_spec.profile} (prefill + decode), real "
                                             f"time over HTTP{arm}")
                    for i in range(launcher_spec.engines)]
        return [LauncherProvider(SimLauncher(profile=launcher_spec.profile, kv_role=None if role == "none" else role,
                                             engine=launcher_spec.engine),
                                 model=spec.model, api_key=api_key, gpu=None, log_dir_for=store.engine_dir,
                                 slot=slot(i), read_timeout_s=spec.read_timeout_s,
                                 description=f"embedded engine {launcher_spec.profile}, real time over HTTP{arm}")
                for i in range(launcher_spec.engines)]
    if isinstance(launcher_spec, PairLauncherSpec):
        connector, addresses = pair_connector(launcher_spec)
        instances = []
        for inst_role, inst in (("prefill", launcher_spec.prefill), ("decode", launcher_spec.decode)):
            instances.append(LocalLauncher(
                command=inst.command, store=store, url=inst.url, variables=dict(launcher_spec.vars),
                env={**launcher_spec.env, **inst.env}, cwd=inst.cwd, health_timeout_s=launcher_spec.health_timeout_s,
                stop_timeout_s=launcher_spec.stop_timeout_s, adopt=launcher_spec.adopt, gpu=spec.gpu,
                deadline=deadline, on_message=on_message, role=inst_role,
            ))
        return [PairProvider(PairLauncher(instances[0], instances[1]), model=spec.model, api_key=api_key, gpu=spec.gpu,
                             connector=connector, p2p_addresses=addresses, read_timeout_s=spec.read_timeout_s,
                             description=f"P/D pair ({connector}): prefill at {launcher_spec.prefill.url}, decode at "
                                         f"{launcher_spec.decode.url}")]
    if isinstance(launcher_spec, LocalLauncherSpec) and launcher_spec.overlap_starts:
        return [_overlapping(spec, launcher_spec, store, api_key, deadline, on_message)]
    if isinstance(launcher_spec, LocalLauncherSpec):
        urls = [launcher_spec.slot_url(i) for i in range(launcher_spec.slots)]
        out: list[EngineProvider] = []
        for i, url in enumerate(urls):
            local = LocalLauncher(
                command=launcher_spec.command, store=store, url=url,
                variables={**launcher_spec.vars, **launcher_spec.slot_values(i)},
                env=launcher_spec.slot_env(i), cwd=launcher_spec.cwd, health_timeout_s=launcher_spec.health_timeout_s,
                stop_timeout_s=launcher_spec.stop_timeout_s, adopt=launcher_spec.adopt, gpu=spec.gpu,
                deadline=deadline, on_message=on_message, siblings=frozenset(urls) - {url},
                engine=launcher_spec.engine,
            )
            gpu_slot = f"GPU {launcher_spec.gpus[i]}" if launcher_spec.gpus else ""
            out.append(LauncherProvider(local, model=spec.model, api_key=api_key, gpu=spec.gpu, slot=gpu_slot,
                                        read_timeout_s=spec.read_timeout_s,
                                        description=f"local engine at {url}" + (f" on {gpu_slot}" if gpu_slot else "")))
        return out
    launcher: Launcher
    if isinstance(launcher_spec, ExternalLauncherSpec):
        launcher = ExternalLauncher(url=launcher_spec.url, chunk_size=launcher_spec.chunk_size, gpu=spec.gpu,
                                    engine=launcher_spec.engine, command=launcher_spec.command_words)
        what = f"external engine at {launcher_spec.url}"
    elif isinstance(launcher_spec, KubernetesLauncherSpec):
        launcher = KubernetesLauncher(launcher_spec, gpu=spec.gpu, on_message=on_message)
        what = f"Kubernetes ({launcher_spec.tool}) engine at {launcher_spec.url}"
    else:  # pragma: no cover - the schema admits no other kind
        raise ConfigError(f"launcher.kind: {launcher_spec!r}")
    return [LauncherProvider(launcher, model=spec.model, api_key=api_key, gpu=spec.gpu, description=what,
                             read_timeout_s=spec.read_timeout_s)]
