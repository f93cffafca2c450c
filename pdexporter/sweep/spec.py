"""The sweep file (`sweeps/*.yaml`): a pydantic schema, pure apart from `load_sweep`.

Every model forbids unknown fields, so a typo is an error, not a silently ignored setting. Any
problem becomes one line naming the file and the field, e.g.

    sweeps/x.yaml: grid.decode_batch_sizes[2]: must be >= 0 (got -1)

The reference for every field is docs/sweep.md.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    BeforeValidator,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from pdexporter._internal.bounds import (
    MAX_DECODE_BATCH,
    MAX_REPS,
    MAX_RETRIES,
    MAX_SECONDS,
    MAX_TOKENS,
    MIN_DECODE_BATCH,
)
from pdexporter._internal.finite import YamlProblem, load_yaml_strict
from pdexporter._internal.redact import (
    redact_argv,
    redact_env,
    redact_text,
    remember_secret,
    secret_values,
    shell_words,
)
from pdexporter._internal.text import read_utf8
from pdexporter._internal.validation import flag_error, format_validation_error
from pdexporter.engines import PAIR_ENGINE, UNIDENTIFIED, adapter
from pdexporter.errors import ConfigError
from pdexporter.launch.specs import (
    LAUNCHERS,
    ExternalLauncherSpec,
    KubernetesLauncherSpec,
    LauncherSpec,
    LocalLauncherSpec,
    Seconds,
    SimLauncherSpec,
    _Strict,
    _unique,
)
from pdexporter.measure.point import DEFAULT_RETRIES
from pdexporter.measure.protocol import ProtocolSettings

__all__ = [
    "CooldownSpec",
    "CvSpec",
    "DEFAULT_LAUNCHER",
    "DecodeBatch",
    "FAITHFUL_COOLDOWN_S",
    "FastSpec",
    "GridSpec",
    "Mode",
    "OrderSpec",
    "SAFE_NAME",
    "SWEEP_STATE",
    "SweepSpec",
    "TokenCount",
    "WarmupSpec",
    "external_engine",
    "load_sweep",
    "narrow_grid",
    "parse_sweep",
    "prediction_root",
]

Mode = Literal["faithful", "fast"]
SAFE_NAME = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9._-]{0,127}")
# beside a sweep's results: its spec (redacted) and one entry per invocation
# (`controller.SweepController._write_state`); `reanalyse` reads the spec's protocol back from it
SWEEP_STATE = "sweep.json"

# The seed's 5 s "wait for KV eviction" between runs: kept in faithful mode, which follows the
# seed step by step; fast mode needs none (docs/sweep.md, "Cooldown").
FAITHFUL_COOLDOWN_S = 5.0


def _whole(value: Any) -> Any:
    """A whole float (YAML's `1.0e+26`) as an int, so that its bound, not its size, is what a
    one-line error names."""
    return int(value) if isinstance(value, float) and value.is_integer() else value


TokenCount = Annotated[int, BeforeValidator(_whole), Field(ge=1, le=MAX_TOKENS)]  # P, chunk sizes (`_internal.bounds`)
DecodeBatch = Annotated[int, BeforeValidator(_whole), Field(ge=MIN_DECODE_BATCH, le=MAX_DECODE_BATCH)]


class GridSpec(_Strict):
    """The seed's independent variables; lists run in the order written."""

    chunk_sizes: list[TokenCount] = Field(min_length=1)
    decode_batch_sizes: list[DecodeBatch] = Field(min_length=1)
    new_prefill_tokens: list[TokenCount] = Field(min_length=1)
    # Only these [B, D, P] configurations of the product (e.g. the points of an earlier sweep that
    # failed the CV criterion, re-run); None: the whole product.
    only: list[tuple[TokenCount, DecodeBatch, TokenCount]] | None = None

    _check_unique = field_validator("chunk_sizes", "decode_batch_sizes", "new_prefill_tokens")(_unique)

    @model_validator(mode="after")
    def _only_in_grid(self) -> GridSpec:
        for i, (b, d, p) in enumerate(self.only or []):
            if b not in self.chunk_sizes or d not in self.decode_batch_sizes or p not in self.new_prefill_tokens:
                raise ValueError(f"grid.only[{i}] = [{b}, {d}, {p}] is not in the grid's lists")
        return self

    def includes(self, key: tuple[int, int, int]) -> bool:
        return self.only is None or tuple(key) in {tuple(k) for k in self.only}

    def budget_problem(self, engine: str) -> str | None:
        """The first (B, D) of the grid that leaves the engine's prefill no budget, in one line."""
        rules = adapter(engine)
        for b in self.chunk_sizes:
            for d in self.decode_batch_sizes:
                problem = rules.budget_problem(b, d)
                if problem:
                    return f"D={d} with chunk size {b}: {problem}"
        return None

    @property
    def size(self) -> int:
        if self.only is not None:
            return len({tuple(k) for k in self.only})
        return len(self.chunk_sizes) * len(self.decode_batch_sizes) * len(self.new_prefill_tokens)


class WarmupSpec(_Strict):
    """After each engine start: put the shared probe prefix in the prefix cache, and run one cold
    prefill of every P so first-shape JIT/autotune work (~1.3 s on a GPU) stays out of windows."""

    prefix: bool = True
    shapes: bool = True
    # One unrecorded window of every (D, P) before its first repetition: the chunk beside D decodes
    # is a batch shape the D = 0 shape warm-up never ran, and its first occurrence pays vLLM's
    # JIT/compile (on the H200: 831 and 1,626 ms once, against ~45 ms; GPU session 3's CV re-run).
    mixed: bool = False


class CooldownSpec(_Strict):
    """Faithful mode's idle wait after each Phase 2 run (None: the seed's 5 s). Fast mode never
    idles: its probes keep decoding between injections, and the engine needs no wait (docs/sweep.md)."""

    seconds: float | None = Field(None, ge=0, le=MAX_SECONDS)


class OrderSpec(_Strict):
    """In which order a chunk size's repetitions run (docs/sweep.md, "Interleaving").

    `blocked` (the seed's): all repetitions of one configuration, then the next. `interleaved`:
    block k holds repetition k of every configuration, in an order drawn from `seed` (D values
    shuffled, the P values of each D shuffled; `plan.block_order`), so drift that lasts tens of
    seconds spreads over every configuration instead of landing on one."""

    kind: Literal["blocked", "interleaved"] = "blocked"
    seed: int = 0


class CvSpec(_Strict):
    """The seed's reproducibility criterion: CV of the penalty over one attempt's reps."""

    threshold: float = Field(0.15, gt=0, le=1e6)
    max_reruns: int = Field(1, ge=0, le=MAX_RETRIES)


class FastSpec(_Strict):
    """Fast mode: probe streams live across injections until their context has grown by this much
    beyond decode_context_tokens (then a fresh set starts), keeping context near the seed's 4096."""

    max_context_drift_tokens: int = Field(512, ge=1, le=MAX_TOKENS)


class SweepSpec(_Strict):
    name: str | None = None
    model: str | None = None  # served model name; default: the engine's first
    gpu: str | None = None  # recorded in every record's config.gpu
    grid: GridSpec
    reps: Annotated[int, BeforeValidator(_whole)] = Field(5, ge=1, le=MAX_REPS)
    mode: Mode = "faithful"
    retries: Annotated[int, BeforeValidator(_whole)] = Field(
        DEFAULT_RETRIES, ge=0, le=MAX_RETRIES
    )  # per repetition, after a MeasurementError (e.g. no steady state)
    protocol: ProtocolSettings = ProtocolSettings()
    warmup: WarmupSpec = WarmupSpec()
    cooldown: CooldownSpec = CooldownSpec()
    cv: CvSpec = CvSpec()
    order: OrderSpec = OrderSpec()
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
        engine = self.engine
        if engine is not None:
            problem = self.grid.budget_problem(engine)
            if problem:
                raise ValueError(f"grid: {problem} ({engine})")
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
    def engine(self) -> str | None:
        """The engine (setup) the launcher runs, by its adapter's name; None: an external engine
        that will say who it is (`client.identity`)."""
        launcher = self.launcher
        if isinstance(launcher, (LocalLauncherSpec, SimLauncherSpec)):
            return launcher.setup
        if isinstance(launcher, ExternalLauncherSpec):
            return launcher.engine
        if isinstance(launcher, KubernetesLauncherSpec):
            return launcher.engine
        return PAIR_ENGINE  # a pair: vLLM instances (launch/pair.py)

    @property
    def slots(self) -> int:
        """Engines the sweep runs side by side (one chunk size each): the local launcher's `gpus`,
        the embedded engine's `engines`; one otherwise."""
        launcher = self.launcher
        return launcher.slots if isinstance(launcher, (LocalLauncherSpec, SimLauncherSpec)) else 1

    @property
    def cooldown_s(self) -> float:
        if self.mode == "fast":
            return 0.0
        return FAITHFUL_COOLDOWN_S if self.cooldown.seconds is None else self.cooldown.seconds

    def launcher_secrets(self) -> list[str]:
        """The secret values of the launcher (and of a pair's two): its `vars` and `env` whose names
        look secret, and the values its command line gives secret-looking flags and `NAME=value`
        words once its `{placeholders}` are filled (`--hf-token {hf}`: hf's value, whatever its name)."""
        found: list[str] = []
        launcher = self.launcher
        for node in (launcher, getattr(launcher, "prefill", None), getattr(launcher, "decode", None)):
            if node is None:
                continue
            variables = getattr(node, "vars", None) or {}
            command = getattr(node, "command", None)
            found += secret_values(variables=variables, env=getattr(node, "env", None),
                                   argv=_filled_words(command, variables) if isinstance(command, str) else ())
        return found

    def redacted_dump(self) -> dict[str, Any]:
        """The spec as JSON for files pdexporter writes (`sweep.json`): secret values of the
        launcher's `vars` and `env` and `NAME=value` / `--secret value` words of its command
        replaced by ***, then every other occurrence of those values (`launcher_secrets`), and URL
        passwords, anywhere."""
        data = self.model_dump(mode="json")
        launcher = data.get("launcher") or {}
        for node in (launcher, launcher.get("prefill"), launcher.get("decode")):
            if not isinstance(node, dict):
                continue
            for key in ("env", "vars"):
                if isinstance(node.get(key), dict):
                    node[key] = redact_env(node[key])
            if isinstance(node.get("command"), str):
                node["command"] = " ".join(redact_argv(node["command"].split()))
        return _redact_leaves(data, self.launcher_secrets())

    def redact(self, obj: Any) -> Any:
        """`obj` (JSON-like) with the launcher's secret values (`launcher_secrets`) and URL
        passwords replaced by *** (for sweep.json's invocation entries: an error message may quote
        a command)."""
        return _redact_leaves(obj, self.launcher_secrets())

    def points(self) -> Iterator[tuple[int, int, int]]:
        """(chunk size, D, P) in run order."""
        for b in self.grid.chunk_sizes:
            for d in self.grid.decode_batch_sizes:
                for p in self.grid.new_prefill_tokens:
                    if self.grid.includes((b, d, p)):
                        yield (b, d, p)

    def fast_probe_tokens(self, chunk_size: int) -> int:
        """max_tokens of a fast-mode probe: room for the drift, and for the largest window."""
        s = self.protocol
        largest = max(
            s.window_tokens(self.engine or UNIDENTIFIED, max(self.grid.new_prefill_tokens), chunk_size, d)
            for d in self.grid.decode_batch_sizes
        )
        return s.inject_at_tokens + max(self.fast.max_context_drift_tokens, largest)


def _filled_words(command: str, variables: Mapping[str, str]) -> list[str]:
    """A launcher's command line with its variables filled in (the others left as `{name}`), in words
    (an unbalanced quote: the spec's own check names it; here, words at spaces)."""
    return shell_words(re.sub(r"\{(\w+)\}", lambda m: str(variables.get(m.group(1), m.group(0))), command))


def _redact_leaves(node: Any, secrets: list[str]) -> Any:
    if isinstance(node, str):
        return redact_text(node, secrets)
    if isinstance(node, dict):
        return {k: _redact_leaves(v, secrets) for k, v in node.items()}
    if isinstance(node, list):
        return [_redact_leaves(v, secrets) for v in node]
    return node


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


def load_sweep(path: str | Path, overrides: dict[str, Any] | None = None, *,
               chunk_index: int | None = None, flags: Mapping[str, str] | None = None,
               external: tuple[str, int | None] | tuple[str, int | None, str] | None = None) -> SweepSpec:
    """Read a sweep file; `overrides` are dotted keys (`mode`, `launcher.clock`) from the CLI.

    `chunk_index`: keep only the I-th chunk size of the file's grid, in file order (`--chunk-index`,
    a Kubernetes Indexed Job's completion index), before anything is checked against it.
    `external`: (URL, chunk size or None[, what said it]) of an engine already running (`--target`,
    `--chunk-size`): the file's launcher is replaced, and its grid narrowed to that chunk size (`external_engine`).
    `flags`: dotted field -> the flag that set it, so a bad override is blamed on the flag
    (`--mode 'turbo': ...`), not on the file."""
    path = Path(path)
    text = read_utf8(path, ConfigError, "; save the sweep file as UTF-8")
    try:
        data = load_yaml_strict(text)  # no key twice, no .nan or .inf, no 5000-digit number
    except YamlProblem as exc:
        raise ConfigError(f"{path}: {exc}") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}: " if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc)
        raise ConfigError(f"{path}: {where}not valid YAML ({problem})") from exc
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping of sweep settings at the top level")
    if chunk_index is not None:
        data = {**data, "grid": narrow_grid(data.get("grid"), chunk_index, str(path))}
    if external is not None:
        data = {**data, **external_engine(data.get("grid"), external[0], external[1], str(path), *external[2:])}
    if "launcher" not in data and any(key.startswith("launcher.") for key in overrides or {}):
        data = {**data, "launcher": {"kind": DEFAULT_LAUNCHER.kind}}  # `--clock` on a file without one
    for key, value in (overrides or {}).items():
        _set_dotted(data, key, value)
    spec = parse_sweep(data, str(path), flags)
    for secret in spec.launcher_secrets():  # never printed, logged or written from now on
        remember_secret(secret)
    return spec


def _grid_sizes(grid: Any) -> list[int]:
    sizes = grid.get("chunk_sizes") if isinstance(grid, dict) else None
    return [s for s in sizes if isinstance(s, int)] if isinstance(sizes, list) else []


def _grid_at(grid: dict[str, Any], chunk_size: int) -> dict[str, Any]:
    """The grid at one chunk size: its `only` points of other chunk sizes dropped too."""
    out = {**grid, "chunk_sizes": [chunk_size]}
    if isinstance(grid.get("only"), list):
        out["only"] = [k for k in grid["only"] if not isinstance(k, list | tuple) or not k or k[0] == chunk_size]
    return out


def narrow_grid(grid: Any, index: int, source: str) -> dict[str, Any]:
    """The grid with only its `index`-th chunk size (file order); one line if there is none."""
    sizes = grid.get("chunk_sizes") if isinstance(grid, dict) else None
    if not isinstance(sizes, list) or not sizes:
        raise ConfigError(f"{source}: grid.chunk_sizes: required (a list) for --chunk-index")
    if not 0 <= index < len(sizes):
        raise ConfigError(f"--chunk-index {index}: out of range, {source} lists {len(sizes)} chunk size(s) "
                          f"(indices 0..{len(sizes) - 1})")
    return _grid_at(grid, sizes[index])


def external_engine(grid: Any, url: str, chunk_size: int | None, source: str,
                    said_by: str = "--chunk-size") -> dict[str, Any]:
    """Settings for an engine already running at `url` (`--target`) with `chunk_size`
    (`said_by`: --chunk-size, or the --engine-command that starts it with one; None if neither says): an
    external launcher, and the grid at that one chunk size.
    Without `--chunk-size`, a grid of one chunk size says it; a grid of several cannot, since that
    engine runs with one of them and pdexporter cannot tell which (vLLM does not publish it)."""
    sizes = _grid_sizes(grid)
    out: dict[str, Any] = {"launcher": {"kind": "external", "url": url, "chunk_size": chunk_size}}
    shown = ", ".join(map(str, sizes))
    if chunk_size is None:
        if len(set(sizes)) > 1:
            raise ConfigError(
                f"--target {url}: {source} has chunk sizes {shown} and an engine already running has one; pass "
                "--chunk-size B, the max_num_batched_tokens it was started with (the grid runs at B only), or "
                "--chunk-index I")
    elif sizes and chunk_size not in sizes:
        raise ConfigError(f"{said_by} {chunk_size}: not in {source}'s grid.chunk_sizes ({shown})")
    elif isinstance(grid, dict) and len(sizes) > 1:
        out["grid"] = _grid_at(grid, chunk_size)
    return out


def parse_sweep(data: dict[str, Any], source: str = "<sweep>", flags: Mapping[str, str] | None = None) -> SweepSpec:
    """`SweepSpec` from a file's data; a problem is one line naming the file and the field, or the
    flag (`flags`: dotted field -> flag) where a command-line option set the field."""
    try:
        return SweepSpec.model_validate(data)
    except ValidationError as exc:
        unions = {"launcher": LAUNCHERS}
        if flags:
            line = flag_error(exc, SweepSpec, flags, unions)
            if line is not None:
                raise ConfigError(line) from None
        raise ConfigError(f"{source}: {format_validation_error(exc, SweepSpec, unions)}") from None


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


DEFAULT_LAUNCHER = SweepSpec.model_fields["launcher"].default  # a file without `launcher`: the embedded engine

