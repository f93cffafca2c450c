"""The engines (setups) the embedded engine imitates, one behaviour object each, found by name.

Everything the embedded engine does differently for the engine it imitates is here, once: whose
scheduler runs the steps, whose series /metrics serves, whose log prefix the step lines carry,
which path says who it is, the version it reports, whether it models a P/D pair's KV roles. The
engine core, the server and the in-process driver ask `imitation(name)`; none of them compares an
engine's name. The rules an imitation shares with the real engine (chunking, metric names, step
log format) stay in that engine's adapter (`pdexporter.engines`), which each imitation names.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from pdexporter.engines import DEFAULT_ENGINE, SIM_ENGINE, sim_engine
from pdexporter.sim import SGLANG_VERSION

if TYPE_CHECKING:
    from pdexporter.sim.profile import Profile
    from pdexporter.sim.scheduler import SchedulerConfig

__all__ = ["DEFAULT_IMITATION", "IMITATIONS", "Imitation", "for_serve", "imitation", "sglang_log_prefix",
           "vllm_log_prefix"]

def vllm_log_prefix(wall: float, pid: int) -> str:
    """`(EngineCore_DP0 pid=N) INFO MM-DD HH:MM:SS [core.py:NNN] ` as vLLM's engine core prints."""
    return f"(EngineCore_DP0 pid={pid}) INFO {time.strftime('%m-%d %H:%M:%S', time.localtime(wall))} [core.py:1132] "


def sglang_log_prefix(wall: float, pid: int) -> str:
    """`[YYYY-MM-DD HH:MM:SS] ` as SGLang's one-GPU scheduler prints."""
    return f"[{time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(wall))}] "


def _vllm_version(profile: Profile) -> str:
    return profile.engine.vllm_version  # the vLLM release its profile was measured on


def _sglang_version(profile: Profile) -> str:
    return SGLANG_VERSION


def _vllm_scheduler(config: SchedulerConfig, connector: Any, mixed_chunk: bool) -> Any:
    from pdexporter.sim.scheduler import Scheduler

    return Scheduler(config, connector=connector)


def _sglang_scheduler(config: SchedulerConfig, connector: Any, mixed_chunk: bool) -> Any:
    from pdexporter.sim.sglang_scheduler import SglangScheduler

    return SglangScheduler(config, mixed_chunk=mixed_chunk)


def _vllm_metrics(profile: Profile, cache_config: dict[str, str] | None, decode_log_interval: int) -> Any:
    from pdexporter.sim.vllm_metrics import VllmMetrics

    return VllmMetrics(profile.model.name, max_model_len=profile.engine.max_model_len, cache_config=cache_config)


def _sglang_metrics(profile: Profile, cache_config: dict[str, str] | None, decode_log_interval: int) -> Any:
    from pdexporter.sim.sglang_metrics import SglangMetrics

    return SglangMetrics(profile.model.name, decode_log_interval=decode_log_interval,
                         max_total_tokens=profile.engine.kv_capacity_tokens)


@dataclass(frozen=True)
class Imitation:
    """One engine (setup) the embedded engine imitates.

    `name`: the engine's adapter name (what `--engine` and a sweep's launcher say); `serve_engine`:
    `sim serve --engine`'s value for it (SGLang's modes share one, `--enable-mixed-chunk` picks the
    mode: the adapter's chunk flags); `identity_routes`: the GET paths that say who it is;
    `metrics_always`: /metrics is served whatever the options (vLLM; SGLang needs --enable-metrics);
    `kv_roles`: it models the instances of a P/D pair (`--kv-role`); `owned_by`: /v1/models' field;
    `mixed_chunk`: the decodes share a chunk's step (SGLang's --enable-mixed-chunk)."""

    name: str
    serve_engine: str
    log_prefix: Callable[[float, int], str]
    identity_routes: tuple[str, ...]
    metrics_always: bool
    kv_roles: bool
    owned_by: str
    base_version: Callable[[Profile], str]
    make_scheduler: Callable[[SchedulerConfig, Any, bool], Any]
    make_metrics: Callable[[Profile, dict[str, str] | None, int], Any]
    mixed_chunk: bool = False

    @property
    def record_name(self) -> str:
        """The adapter name its records carry (`engines.IMITATED`)."""
        return sim_engine(self.name)

    def version(self, profile: Profile) -> str:
        """The version of the engine it imitates, with a local label naming the embedded engine (PEP 440)."""
        return f"{self.base_version(profile)}+pdexporter.sim"

    def command(self, profile: str) -> tuple[str, ...]:
        """The start of its command line (`pdexporter-sim --profile NAME [--engine E]`); the
        adapter's chunk-size flags follow."""
        engine = () if self.serve_engine == DEFAULT_IMITATION else ("--engine", self.serve_engine)
        return (SIM_ENGINE, "--profile", profile, *engine)

    def scheduler(self, config: SchedulerConfig, connector: Any = None) -> Any:
        """Its scheduler (vLLM v1's, or SGLang's batch policy in its mode)."""
        if connector is not None and not self.kv_roles:
            raise ValueError(f"the embedded engine models KV roles imitating {DEFAULT_IMITATION} only "
                             f"(imitates {self.name})")
        return self.make_scheduler(config, connector, self.mixed_chunk)

    def metrics(self, profile: Profile, *, cache_config: dict[str, str] | None = None,
                decode_log_interval: int = 1) -> Any:
        """Its series (`VllmMetrics` or `SglangMetrics`), under its engine's names."""
        return self.make_metrics(profile, cache_config, decode_log_interval)


DEFAULT_IMITATION = DEFAULT_ENGINE  # vLLM: the embedded engine imitates it unless told otherwise

_VLLM = Imitation(DEFAULT_IMITATION, DEFAULT_IMITATION, vllm_log_prefix, ("/version",), metrics_always=True,
                  kv_roles=True, owned_by=DEFAULT_IMITATION, base_version=_vllm_version,
                  make_scheduler=_vllm_scheduler, make_metrics=_vllm_metrics)
_SGLANG = Imitation("sglang", "sglang", sglang_log_prefix, ("/server_info", "/get_server_info"),
                    metrics_always=False, kv_roles=False, owned_by="sglang", base_version=_sglang_version,
                    make_scheduler=_sglang_scheduler, make_metrics=_sglang_metrics)

# name -> behaviour; the names are the adapters' (`engines.IMITATED` says the names its records carry)
IMITATIONS: Mapping[str, Imitation] = {
    i.name: i for i in (_VLLM, _SGLANG, replace(_SGLANG, name="sglang-mixed", mixed_chunk=True))
}


def for_serve(engine: str, *, mixed_chunk: bool = False, kv_role: str | None = None) -> Imitation:
    """The imitation `sim serve --engine ENGINE [--enable-mixed-chunk] [--kv-role ROLE]` asks for;
    ConfigError, one line naming the flag, for a combination no imitation has."""
    from pdexporter.errors import ConfigError

    engines = list(dict.fromkeys(i.serve_engine for i in IMITATIONS.values()))
    if engine not in engines:
        raise ConfigError(f"--engine {engine!r}: the embedded engine imitates {' or '.join(engines)}")
    found = [i for i in IMITATIONS.values() if i.serve_engine == engine and i.mixed_chunk == mixed_chunk]
    if not found:
        mixed = [i.serve_engine for i in IMITATIONS.values() if i.mixed_chunk]
        raise ConfigError(f"--enable-mixed-chunk: an SGLang flag; add --engine {mixed[0]}")
    if kv_role not in (None, "none") and not found[0].kv_roles:
        roles = [i.name for i in IMITATIONS.values() if i.kv_roles]
        raise ConfigError(f"--kv-role {kv_role}: the embedded engine models P/D roles imitating "
                          f"{', '.join(roles)} only")
    return found[0]


def imitation(name: str) -> Imitation:
    """The imitation registered under `name`; ValueError naming those there are for any other."""
    found = IMITATIONS.get(name)
    if found is None:
        raise ValueError(f"imitates={name!r}: expected one of {', '.join(IMITATIONS)}")
    return found
