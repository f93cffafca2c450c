"""The `launcher` of a sweep file: one pydantic schema per way of getting an engine (`local`,
`external`, `sim`, `kubernetes`, `pair`), beside the launchers that read them (docs/sweep.md).
`sweep.spec` holds the rest of the sweep file."""

from __future__ import annotations

import shlex
from collections.abc import Hashable
from typing import Annotated, Any, Literal, TypeVar

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    field_validator,
    model_validator,
)

from pdexporter._internal.bounds import MAX_SECONDS, MAX_TOKENS
from pdexporter.engines import adapter, check_pair, registered, sim_engine
from pdexporter.errors import ConfigError

__all__ = [
    "DEFAULT_SIM_PROFILE",
    "LAUNCHERS",
    "MULTI_GPU_ENV",
    "SLOT_PLACEHOLDERS",
    "EngineName",
    "ExternalLauncherSpec",
    "KubernetesLauncherSpec",
    "LauncherSpec",
    "LocalLauncherSpec",
    "PairInstanceSpec",
    "PairLauncherSpec",
    "Seconds",
    "SimLauncherSpec",
]

# the embedded engine's profile when neither the file nor the imitated engine's adapter names one
DEFAULT_SIM_PROFILE = "h200-qwen3-coder-30b-a3b"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


Seconds = Annotated[float, Field(gt=0, le=MAX_SECONDS)]


H = TypeVar("H", bound=Hashable)


def _unique(values: list[H]) -> list[H]:
    seen: set[H] = set()
    for i, value in enumerate(values):
        if value in seen:
            raise ValueError(f"[{i}] = {value} appears twice")
        seen.add(value)
    return values


# Set in every engine's environment when a sweep runs one engine per GPU (`launcher.gpus`): NVLink
# multicast (NVLS) off, as the multi-GPU machines this runs on require (NCCL, torch symmetric
# memory, NVSHMEM). `launcher.env` may override any of them.
MULTI_GPU_ENV: dict[str, str] = {
    "NCCL_NVLS_ENABLE": "0",
    "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
    "NVSHMEM_DISABLE_NVLS": "1",
}


SLOT_PLACEHOLDERS = ("gpu", "port")


def _engine_name(value: str) -> str:
    if value not in registered():
        raise ValueError(f"{value!r} is not a registered engine (registered: {', '.join(registered())})")
    return value


EngineName = Annotated[str, AfterValidator(_engine_name)]


class LocalLauncherSpec(_Strict):
    """Start the engine from a command template; {chunk} and every key of `vars` are filled in.
    `engine` names the engine the command starts (its adapter: chunk flag, step log, metrics);
    its setup follows from the command (SGLang's --enable-mixed-chunk, vLLM's KV connector).

    With `gpus`, one engine per GPU: the engine on `gpus[i]` gets `CUDA_VISIBLE_DEVICES=gpus[i]`,
    {gpu} = gpus[i] and {port} = base_port + i (in `command` and `url`), and chunk sizes run in
    parallel, one per engine (docs/sweep.md, "Several GPUs")."""

    kind: Literal["local"]
    command: str = Field(min_length=1)
    engine: EngineName = "vllm"
    url: str = "http://127.0.0.1:8000"
    vars: dict[str, str] = Field(default_factory=dict)
    env: dict[str, str] = Field(default_factory=dict)
    cwd: str | None = None
    health_timeout_s: Seconds = 600.0
    stop_timeout_s: Seconds = 60.0
    adopt: bool = True
    gpus: list[Annotated[str, Field(min_length=1, pattern=r"^[A-Za-z0-9,:_-]+$")]] | None = Field(
        None, min_length=1
    )
    base_port: int = Field(8000, ge=1, le=65535)
    # Start the next chunk size's engine while the current one serves, held before the GPU
    # (`launch.overlap`): two engines at {port} = base_port and base_port + 1, taking turns.
    overlap_starts: bool = False

    @field_validator("gpus", mode="before")
    @classmethod
    def _gpu_names(cls, value: Any) -> Any:
        # `gpus: [0, 1]` in YAML: device indices as CUDA_VISIBLE_DEVICES takes them
        if isinstance(value, list):
            return [str(v) if isinstance(v, int) and not isinstance(v, bool) else v for v in value]
        return value

    @field_validator("gpus")
    @classmethod
    def _unique_gpus(cls, value: list[str] | None) -> list[str] | None:
        return None if value is None else _unique(value)

    @model_validator(mode="after")
    def _has_chunk(self) -> LocalLauncherSpec:
        if "{chunk}" not in self.command:
            raise ValueError(
                f"launcher.command: must contain {{chunk}} (where {adapter(self.engine).chunk_flag} goes)"
            )
        lanes = ("port",) if self.overlap_starts else ()
        problem = template_problem(self.command, {*self.vars, *(SLOT_PLACEHOLDERS if self.gpus else lanes)})
        if problem:
            raise ValueError(f"launcher.command: {problem}")
        return self

    @property
    def setup(self) -> str:
        """The engine setup the command starts (`EngineAdapter.for_command`): "sglang-mixed" for
        SGLang with --enable-mixed-chunk, "vllm-decode-bench" for vLLM with DecodeBenchConnector."""
        try:
            words = shlex.split(self.command.format_map(_Blank(self.vars)))
        except ValueError:
            words = self.command.split()
        return adapter(self.engine).for_command(words)

    @field_validator("url")
    @classmethod
    def _http(cls, value: str) -> str:
        return _check_url(value)

    @model_validator(mode="after")
    def _slots(self) -> LocalLauncherSpec:
        if self.gpus is None:
            return self
        if self.base_port + len(self.gpus) - 1 > 65535:
            raise ValueError(
                f"launcher.base_port: {self.base_port} + {len(self.gpus)} GPUs runs past port 65535"
            )
        taken = [name for name in SLOT_PLACEHOLDERS if name in self.vars]
        if taken:
            raise ValueError(f"launcher.vars.{taken[0]}: reserved with launcher.gpus (filled in per GPU)")
        if "{port}" not in self.command:
            raise ValueError(
                "launcher.command: must contain {port} with launcher.gpus (each GPU's engine has its "
                "own port)"
            )
        if "{port}" not in self.url:
            raise ValueError(
                "launcher.url: must contain {port} with launcher.gpus, e.g. http://127.0.0.1:{port}"
            )
        return self

    @model_validator(mode="after")
    def _overlap(self) -> LocalLauncherSpec:
        if not self.overlap_starts:
            return self
        if self.gpus is not None:
            raise ValueError("launcher.overlap_starts: one GPU only (with launcher.gpus each GPU has its own engine)")
        if self.base_port + 1 > 65535:
            raise ValueError(f"launcher.base_port: {self.base_port} + 1 runs past port 65535")
        if "port" in self.vars:
            raise ValueError("launcher.vars.port: reserved with launcher.overlap_starts (base_port, base_port + 1)")
        for name, text in (("command", self.command), ("url", self.url)):
            if "{port}" not in text:
                raise ValueError(
                    f"launcher.{name}: must contain {{port}} with launcher.overlap_starts (the two engines "
                    "that take turns listen on base_port and base_port + 1)"
                )
        return self

    def lane_values(self, lane: int) -> dict[str, str]:
        """{port} of an overlapped start's lane (0 or 1)."""
        return {"port": str(self.base_port + lane)}

    @property
    def slots(self) -> int:
        return len(self.gpus) if self.gpus else 1

    def slot_values(self, slot: int) -> dict[str, str]:
        """{gpu} and {port} of the engine on `gpus[slot]` (nothing without `gpus`)."""
        if self.gpus is None:
            return {}
        return {"gpu": self.gpus[slot], "port": str(self.base_port + slot)}

    def slot_url(self, slot: int) -> str:
        values = self.slot_values(slot)
        return self.url.replace("{port}", values["port"]) if values else self.url

    def slot_env(self, slot: int) -> dict[str, str]:
        """The engine's environment on `gpus[slot]`: the GPU, NVLS off, then `env`."""
        if self.gpus is None:
            return dict(self.env)
        return {"CUDA_VISIBLE_DEVICES": self.gpus[slot], **MULTI_GPU_ENV, **self.env}


class ExternalLauncherSpec(_Strict):
    """An engine someone else runs; `chunk_size` is the chunk size it was started with (vLLM's
    --max-num-batched-tokens; SGLang says its own), `engine` its adapter when it cannot say who
    it is (None: it says, through /version or /server_info)."""

    kind: Literal["external"]
    url: str
    chunk_size: int | None = Field(None, ge=1, le=MAX_TOKENS)
    engine: EngineName | None = None
    # how the engine was started ('vllm serve ...'), recorded in every record (secrets redacted): its CUDA
    # graphs, which the fit reads, and its chunk size where `chunk_size` is not given
    command: str | None = None

    @field_validator("url")
    @classmethod
    def _http(cls, value: str) -> str:
        return _check_url(value)

    @model_validator(mode="before")
    @classmethod
    def _chunk_of_command(cls, data: Any) -> Any:
        """No `chunk_size`: the one `command` starts the engine with, if it says (its problems: `_command`)."""
        if not isinstance(data, dict) or data.get("chunk_size") is not None or not isinstance(data.get("command"), str):
            return data
        from pdexporter.engines import command_chunk_size

        engine = data.get("engine")
        try:
            said = command_chunk_size(shlex.split(data["command"]), engine if isinstance(engine, str) else None)
        except (ValueError, ConfigError):
            return data
        return data if said is None else {**data, "chunk_size": said[1]}

    @model_validator(mode="after")
    def _command(self) -> ExternalLauncherSpec:
        from pdexporter.launch.external import engine_command_words

        try:
            engine_command_words(self.command, "launcher.command", self.chunk_size, self.engine)
        except ConfigError as exc:
            raise ValueError(str(exc)) from None
        return self

    @property
    def command_words(self) -> tuple[str, ...] | None:
        """`command` as words, secrets redacted (`launch.external.engine_command_words`)."""
        from pdexporter.launch.external import engine_command_words

        return engine_command_words(self.command, "launcher.command")


class SimLauncherSpec(_Strict):
    """The embedded engine: `virtual` clock in-process (seconds for a whole grid), or `real` time
    over HTTP (a child `pdexporter sim serve`). `kv_role` measures the offloaded arm
    (docs/disaggregation.md): "decode-bench" (every new request's KV filled, one engine) or "pd"
    (a prefill and a decode instance with a modelled KV transfer, the routing step in front)."""

    kind: Literal["sim"]
    profile: str = Field("", description="profile name or path ('': the imitated engine's, `sim_profile` of its "
                                         "adapter, else h200-qwen3-coder-30b-a3b)")
    clock: Literal["virtual", "real"] = "virtual"
    kv_role: Literal["none", "decode-bench", "pd"] = "none"
    engines: int = Field(1, ge=1)  # embedded engines side by side, as `gpus` gives a local launcher
    # the engine (setup) it imitates: its scheduling, metric names, step log (engines.IMITATED)
    engine: Literal["vllm", "sglang", "sglang-mixed"] = "vllm"

    @model_validator(mode="before")
    @classmethod
    def _profile(cls, data: object) -> object:
        if isinstance(data, dict) and not data.get("profile"):
            engine = data.get("engine") or "vllm"
            if isinstance(engine, str) and engine in ("vllm", "sglang", "sglang-mixed"):
                data = {**data, "profile": adapter(engine).sim_profile or DEFAULT_SIM_PROFILE}
        return data

    @model_validator(mode="after")
    def _role(self) -> SimLauncherSpec:
        if self.kv_role != "none" and self.engine != "vllm":
            raise ValueError(
                f"launcher.kv_role {self.kv_role}: the embedded engine models P/D roles imitating vllm "
                f"only (engine: {self.engine})"
            )
        return self

    @property
    def slots(self) -> int:
        return self.engines

    @property
    def setup(self) -> str:
        """The adapter name its records carry (`engines.IMITATED`)."""
        return sim_engine(self.engine)


class PairInstanceSpec(_Strict):
    """One engine of a P/D pair: its own command (leading NAME=value words are its environment),
    URL and environment (e.g. CUDA_VISIBLE_DEVICES, VLLM_NIXL_SIDE_CHANNEL_PORT)."""

    command: str = Field(min_length=1)
    url: str
    env: dict[str, str] = Field(default_factory=dict)
    cwd: str | None = None

    @field_validator("url")
    @classmethod
    def _http(cls, value: str) -> str:
        return _check_url(value)


class PairLauncherSpec(_Strict):
    """A 1P1D pair on one host (launch/pair.py): two engines started, health-waited and stopped
    together, each from its own command; `vars` fill both templates, `env` goes to both (on a
    multi-GPU host: NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1).
    The probes run on the decode instance (its command needs {chunk}); the injected prefill is
    routed through the prefill instance first (measure/pd.py). The connector is read from the
    commands' --kv-transfer-config (NixlConnector or P2pNcclConnector), or the embedded engine's
    --kv-role prefill/decode (a modelled NIXL)."""

    kind: Literal["pair"]
    prefill: PairInstanceSpec
    decode: PairInstanceSpec
    vars: dict[str, str] = Field(default_factory=dict)
    env: dict[str, str] = Field(default_factory=dict)
    health_timeout_s: Seconds = 600.0
    stop_timeout_s: Seconds = 60.0
    adopt: bool = True

    @model_validator(mode="after")
    def _pair(self) -> PairLauncherSpec:
        for role in ("prefill", "decode"):
            problem = template_problem(getattr(self, role).command, set(self.vars))
            if problem:
                raise ValueError(f"launcher.{role}.command: {problem}")
        problem = check_pair(self)
        if problem:
            raise ValueError(problem)
        return self


class KubernetesLauncherSpec(_Strict):
    """Change the chunk size of an engine deployed on Kubernetes, then wait for the rollout.

    `helm`: `helm upgrade RELEASE CHART --reuse-values --set VALUE_KEY=CHUNK --wait`.
    `kubectl`: patch DEPLOYMENT's container args (`arg_name=CHUNK`; default: the engine's chunk
    flag, `--max-num-batched-tokens` for vLLM, `--chunked-prefill-size` for SGLang), then
    `kubectl rollout status`. Either way the engine must answer at `url` afterwards."""

    kind: Literal["kubernetes"]
    engine: EngineName = "vllm"
    tool: Literal["helm", "kubectl"] = "helm"
    url: str
    namespace: str | None = None
    kube_context: str | None = None
    release: str | None = None
    chart: str | None = None
    value_key: str = "vllm.chunkSize"
    deployment: str | None = None
    container: int = Field(0, ge=0, le=1000)
    arg_name: str | None = None
    rollout_timeout_s: Seconds = 900.0
    health_timeout_s: Seconds = 600.0

    @field_validator("url")
    @classmethod
    def _http(cls, value: str) -> str:
        return _check_url(value)

    @property
    def chunk_arg(self) -> str:
        """The container argument that carries the chunk size."""
        return self.arg_name or adapter(self.engine).chunk_flag

    @model_validator(mode="after")
    def _tool_fields(self) -> KubernetesLauncherSpec:
        if self.tool == "helm" and (not self.release or not self.chart):
            raise ValueError("tool helm needs release and chart")
        if self.tool == "kubectl" and not self.deployment:
            raise ValueError("tool kubectl needs deployment")
        return self


LauncherSpec = Annotated[
    LocalLauncherSpec | ExternalLauncherSpec | SimLauncherSpec | KubernetesLauncherSpec | PairLauncherSpec,
    Field(discriminator="kind"),
]


TEMPLATE_PLACEHOLDERS = ("python", "chunk")  # filled in by `launch.local.render_command`


def template_problem(template: str, defined: set[str]) -> str | None:
    """Why a command template cannot be rendered (a placeholder nobody defines, a stray brace),
    or None: checked when the sweep file is read, before anything is written or started."""
    import string

    try:
        fields = [name for _, name, _, _ in string.Formatter().parse(template) if name is not None]
    except ValueError as exc:
        return f"bad template ({exc}); write a literal brace as {{{{ or }}}}"
    for name in fields:
        base = name.split(".", 1)[0].split("[", 1)[0]
        if not base or base.isdigit():
            return f"{{{name}}}: a placeholder needs a name ({{chunk}}, or a key of launcher.vars)"
        if base not in defined and base not in TEMPLATE_PLACEHOLDERS:
            return f"unknown placeholder {{{base}}}; define it under launcher.vars"
    return None


class _Blank(dict[str, str]):
    """`format_map` values for a command template read before it is rendered: placeholders the
    file does not define become empty."""

    def __missing__(self, key: str) -> str:
        return ""


def _check_url(value: str) -> str:
    if not value.startswith(("http://", "https://")):
        raise ValueError("must be an http:// or https:// URL")
    return value.rstrip("/")


LAUNCHERS: dict[str, type[BaseModel]] = {
    "local": LocalLauncherSpec,
    "external": ExternalLauncherSpec,
    "sim": SimLauncherSpec,
    "kubernetes": KubernetesLauncherSpec,
    "pair": PairLauncherSpec,
}
