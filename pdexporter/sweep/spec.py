"""The sweep file (`sweeps/*.yaml`): a pydantic schema, pure apart from `load_sweep`.

Every model forbids unknown fields, so a typo is an error, not a silently ignored setting. Any
problem becomes one line naming the file and the field, e.g.

    sweeps/x.yaml: grid.decode_batch_sizes[2]: must be >= 0 (got -1)

The reference for every field is docs/sweep.md.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError, field_validator, model_validator

from pdexporter._internal.bounds import MAX_DECODE_BATCH, MAX_REPS, MAX_RETRIES, MAX_SECONDS, MAX_TOKENS
from pdexporter._internal.validation import format_validation_error
from pdexporter._internal.redact import redact_argv, redact_env
from pdexporter.engines import adapter
from pdexporter.errors import ConfigError
from pdexporter.measure.protocol import ProtocolSettings

Mode = Literal["faithful", "fast"]
SAFE_NAME = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9._-]{0,127}")

# The seed's 5 s "wait for KV eviction" between runs: kept in faithful mode, which follows the
# seed step by step; fast mode needs none (docs/sweep.md, "Cooldown").
FAITHFUL_COOLDOWN_S = 5.0


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


def _whole(value: Any) -> Any:
    """A whole float (YAML's `1.0e+26`) as an int, so that its bound, not its size, is what a
    one-line error names."""
    return int(value) if isinstance(value, float) and value.is_integer() else value


TokenCount = Annotated[int, BeforeValidator(_whole), Field(ge=1, le=MAX_TOKENS)]  # P, chunk sizes (`_internal.bounds`)
DecodeBatch = Annotated[int, BeforeValidator(_whole), Field(ge=0, le=MAX_DECODE_BATCH)]
Seconds = Annotated[float, Field(gt=0, le=MAX_SECONDS)]


def _unique(values: list[int]) -> list[int]:
    seen: set[int] = set()
    for i, value in enumerate(values):
        if value in seen:
            raise ValueError(f"[{i}] = {value} appears twice")
        seen.add(value)
    return values


class GridSpec(_Strict):
    """The seed's independent variables; lists run in the order written."""

    chunk_sizes: list[TokenCount] = Field(min_length=1)
    decode_batch_sizes: list[DecodeBatch] = Field(min_length=1)
    new_prefill_tokens: list[TokenCount] = Field(min_length=1)

    _check_unique = field_validator("chunk_sizes", "decode_batch_sizes", "new_prefill_tokens")(_unique)

    @model_validator(mode="after")
    def _budget(self) -> GridSpec:
        for b in self.chunk_sizes:
            for d in self.decode_batch_sizes:
                problem = adapter(None).budget_problem(b, d)
                if problem:
                    raise ValueError(f"D={d} with chunk size {b}: {problem}")
        return self

    @property
    def size(self) -> int:
        return len(self.chunk_sizes) * len(self.decode_batch_sizes) * len(self.new_prefill_tokens)


class WarmupSpec(_Strict):
    """After each engine start: put the shared probe prefix in the prefix cache, and run one cold
    prefill of every P so first-shape JIT/autotune work (~1.3 s on a GPU) stays out of windows."""

    prefix: bool = True
    shapes: bool = True


class CooldownSpec(_Strict):
    """Faithful mode's idle wait after each Phase 2 run (None: the seed's 5 s). Fast mode never
    idles: its probes keep decoding between injections, and the engine needs no wait (docs/sweep.md)."""

    seconds: float | None = Field(None, ge=0, le=MAX_SECONDS)


class CvSpec(_Strict):
    """The seed's reproducibility criterion: CV of the penalty over one attempt's reps."""

    threshold: float = Field(0.15, gt=0, le=1e6)
    max_reruns: int = Field(1, ge=0, le=MAX_RETRIES)


class FastSpec(_Strict):
    """Fast mode: probe streams live across injections until their context has grown by this much
    beyond decode_context_tokens (then a fresh set starts), keeping context near the seed's 4096."""

    max_context_drift_tokens: int = Field(512, ge=1, le=MAX_TOKENS)


class LocalLauncherSpec(_Strict):
    """Start the engine from a command template; {chunk} and every key of `vars` are filled in."""

    kind: Literal["local"]
    command: str = Field(min_length=1)
    url: str = "http://127.0.0.1:8000"
    vars: dict[str, str] = Field(default_factory=dict)
    env: dict[str, str] = Field(default_factory=dict)
    cwd: str | None = None
    health_timeout_s: Seconds = 600.0
    stop_timeout_s: Seconds = 60.0
    adopt: bool = True

    @field_validator("command")
    @classmethod
    def _has_chunk(cls, value: str) -> str:
        if "{chunk}" not in value:
            raise ValueError("must contain {chunk} (where --max-num-batched-tokens goes)")
        return value

    @field_validator("url")
    @classmethod
    def _http(cls, value: str) -> str:
        return _check_url(value)


class ExternalLauncherSpec(_Strict):
    """An engine someone else runs; `chunk_size` is its --max-num-batched-tokens."""

    kind: Literal["external"]
    url: str
    chunk_size: int | None = Field(None, ge=1, le=MAX_TOKENS)

    @field_validator("url")
    @classmethod
    def _http(cls, value: str) -> str:
        return _check_url(value)


class SimLauncherSpec(_Strict):
    """The embedded engine: `virtual` clock in-process (seconds for a whole grid), or `real` time
    over HTTP (a child `pdexporter sim serve`). `kv_role` measures the offloaded arm
    (docs/disaggregation.md): "decode-bench" (every new request's KV filled, one engine) or "pd"
    (a prefill and a decode instance with a modelled KV transfer, the routing step in front)."""

    kind: Literal["sim"]
    profile: str = "h200-qwen3-coder-30b-a3b"
    clock: Literal["virtual", "real"] = "virtual"
    kv_role: Literal["none", "decode-bench", "pd"] = "none"


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
        from pdexporter.launch.pair import check_pair

        problem = check_pair(self)
        if problem:
            raise ValueError(problem)
        return self


class KubernetesLauncherSpec(_Strict):
    """Change the chunk size of an engine deployed on Kubernetes, then wait for the rollout.

    `helm`: `helm upgrade RELEASE CHART --reuse-values --set VALUE_KEY=CHUNK --wait`.
    `kubectl`: patch DEPLOYMENT's container args (`--max-num-batched-tokens=CHUNK`), then
    `kubectl rollout status`. Either way the engine must answer at `url` afterwards."""

    kind: Literal["kubernetes"]
    tool: Literal["helm", "kubectl"] = "helm"
    url: str
    namespace: str | None = None
    kube_context: str | None = None
    release: str | None = None
    chart: str | None = None
    value_key: str = "vllm.chunkSize"
    deployment: str | None = None
    container: int = Field(0, ge=0, le=1000)
    arg_name: str = "--max-num-batched-tokens"
    rollout_timeout_s: Seconds = 900.0
    health_timeout_s: Seconds = 600.0

    @field_validator("url")
    @classmethod
    def _http(cls, value: str) -> str:
        return _check_url(value)

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


def _check_url(value: str) -> str:
    if not value.startswith(("http://", "https://")):
        raise ValueError("must be an http:// or https:// URL")
    return value.rstrip("/")


class SweepSpec(_Strict):
    name: str | None = None
    model: str | None = None  # served model name; default: the engine's first
    gpu: str | None = None  # recorded in every record's config.gpu
    grid: GridSpec
    reps: Annotated[int, BeforeValidator(_whole)] = Field(5, ge=1, le=MAX_REPS)
    mode: Mode = "faithful"
    retries: Annotated[int, BeforeValidator(_whole)] = Field(2, ge=0, le=MAX_RETRIES)  # per repetition, after a MeasurementError (e.g. no steady state)
    protocol: ProtocolSettings = ProtocolSettings()
    warmup: WarmupSpec = WarmupSpec()
    cooldown: CooldownSpec = CooldownSpec()
    cv: CvSpec = CvSpec()
    fast: FastSpec = FastSpec()
    launcher: LauncherSpec = SimLauncherSpec(kind="sim")
    output: str = "results"
    listen: str | None = None
    # The longest silence allowed inside an engine stream (the client's read timeout; `--read-timeout`).
    read_timeout_s: Seconds = 300.0

    @field_validator("name")
    @classmethod
    def _name(cls, value: str | None) -> str | None:
        # `sim sweep` writes to results/sim/{profile}/{name}: a name is one directory, never a path
        if value is not None and not SAFE_NAME.fullmatch(value):
            raise ValueError("must be one directory name: letters, digits, '.', '_' or '-', not starting with "
                             f"'.' (got {value!r})")
        return value

    @field_validator("output")
    @classmethod
    def _output(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("must not be empty")
        if ".." in Path(value).parts:
            raise ValueError(f"must not contain '..': results stay under the directory it names (got {value!r})")
        return value

    @model_validator(mode="after")
    def _cross(self) -> SweepSpec:
        launcher = self.launcher
        if isinstance(launcher, ExternalLauncherSpec):
            if launcher.chunk_size is None and len(set(self.grid.chunk_sizes)) == 1:
                # A grid of one chunk size says what the engine runs with.
                launcher = launcher.model_copy(update={"chunk_size": self.grid.chunk_sizes[0]})
                object.__setattr__(self, "launcher", launcher)
            if launcher.chunk_size is None:
                raise ValueError(
                    "launcher.chunk_size: required for an external engine (pdexporter cannot set its "
                    "--max-num-batched-tokens; say what it was started with)"
                )
            wrong = [b for b in self.grid.chunk_sizes if b != launcher.chunk_size]
            if wrong:
                raise ValueError(
                    f"grid.chunk_sizes: {wrong} cannot be set on the external engine, which runs with "
                    f"chunk size {launcher.chunk_size}; use a launcher that owns the engine "
                    "(local, sim, kubernetes)"
                )
        # a stall inside a window is noticed within the read timeout too (ProtocolSettings.with_read_timeout)
        object.__setattr__(self, "protocol", self.protocol.with_read_timeout(self.read_timeout_s))
        if self.listen is not None:
            from pdexporter.exporter.server import parse_listen

            try:
                parse_listen(self.listen)
            except ConfigError as exc:
                raise ValueError(f"listen: {exc}") from None
        return self

    @property
    def cooldown_s(self) -> float:
        if self.mode == "fast":
            return 0.0
        return FAITHFUL_COOLDOWN_S if self.cooldown.seconds is None else self.cooldown.seconds

    def redacted_dump(self) -> dict[str, Any]:
        """The spec as JSON for files pdexporter writes (`sweep.json`): secret values of the
        launcher's `env` and `NAME=value` / `--secret value` words of its command replaced by ***."""
        data = self.model_dump(mode="json")
        launcher = data.get("launcher") or {}
        for node in (launcher, launcher.get("prefill"), launcher.get("decode")):
            if not isinstance(node, dict):
                continue
            if isinstance(node.get("env"), dict):
                node["env"] = redact_env(node["env"])
            if isinstance(node.get("command"), str):
                node["command"] = " ".join(redact_argv(node["command"].split()))
        return data

    def points(self) -> Iterator[tuple[int, int, int]]:
        """(chunk size, D, P) in run order."""
        for b in self.grid.chunk_sizes:
            for d in self.grid.decode_batch_sizes:
                for p in self.grid.new_prefill_tokens:
                    yield (b, d, p)

    def fast_probe_tokens(self, chunk_size: int) -> int:
        """max_tokens of a fast-mode probe: room for the drift, and for the largest window."""
        s = self.protocol
        largest = max(
            s.window_tokens(None, max(self.grid.new_prefill_tokens), chunk_size, d)
            for d in self.grid.decode_batch_sizes
        )
        return s.inject_at_tokens + max(self.fast.max_context_drift_tokens, largest)


def prediction_root(profile: str, name: str, base: str | Path = "results") -> Path:
    """Where `sim sweep` writes by default: `results/sim/{profile}/{name}`, each part one directory
    (a profile given as a file path is named by its file's stem), so nothing lands outside `base`."""
    profile_dir = Path(profile).stem if ("/" in profile or profile.endswith((".yaml", ".yml"))) else profile
    for what, part in (("--profile", profile_dir), ("name", name)):
        if not SAFE_NAME.fullmatch(part):
            raise ConfigError(f"{what} {part!r}: cannot name a results directory (letters, digits, '.', '_', '-')")
    return Path(base) / "sim" / profile_dir / name


# ---------------------------------------------------------------------------------------------
# Loading and one-line errors


def load_sweep(path: str | Path, overrides: dict[str, Any] | None = None) -> SweepSpec:
    """Read a sweep file; `overrides` are dotted keys (`mode`, `launcher.clock`) from the CLI."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read ({exc.strerror or exc})") from exc
    except UnicodeDecodeError as exc:
        line = exc.object[: exc.start].count(b"\n") + 1
        raise ConfigError(f"{path}: line {line}: not UTF-8 text (byte 0x{exc.object[exc.start]:02x} at offset "
                          f"{exc.start}); save the sweep file as UTF-8") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}: " if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc)
        raise ConfigError(f"{path}: {where}not valid YAML ({problem})") from exc
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping of sweep settings at the top level")
    for key, value in (overrides or {}).items():
        _set_dotted(data, key, value)
    return parse_sweep(data, str(path))


def parse_sweep(data: dict[str, Any], source: str = "<sweep>") -> SweepSpec:
    try:
        return SweepSpec.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(f"{source}: {format_validation_error(exc, SweepSpec, {'launcher': LAUNCHERS})}") from None


def _set_dotted(data: dict[str, Any], key: str, value: Any) -> None:
    *parents, last = key.split(".")
    node = data
    for part in parents:
        child = node.get(part)
        if not isinstance(child, dict):
            child = {}
            node[part] = child
        node = child
    node[last] = value


LAUNCHERS: dict[str, type[BaseModel]] = {
    "local": LocalLauncherSpec,
    "external": ExternalLauncherSpec,
    "sim": SimLauncherSpec,
    "kubernetes": KubernetesLauncherSpec,
    "pair": PairLauncherSpec,
}
