"""The package moves of issue 22 ("a house that shows the seam"), as a script, so that they can be
applied again after a rebase onto a main that moved on (drop the commit it made, rebase, run it
again, check, commit):

    python scripts/house_moves.py [--dry-run]

One direction for imports between packages, read bottom to top:

    errors, _internal < engines (the adapters) < client (talking to an engine; was `engine/`, one
    letter from `engines/`) < sim (the embedded engine: scheduler, step-time model, profiles,
    engine core, server) < launch (ways of getting an engine, with their sweep-file specs) <
    measure (the protocol and its drivers: HTTP, a P/D pair, the embedded engine in process) <
    load < analysis < exporter < sweep (the controller, its providers, re-analysis) < predict (the
    protocol on the embedded engine: predicted grids, calibration, passive mode in process) <
    grafana, doctor < cli

`tests/unit/test_layers.py` (written by this script) keeps it so: a package imports only packages
below it.

What moves (git mv, then every import and every mention rewritten, in code, tests, scripts and docs):

- `pdexporter/engine/` -> `pdexporter/client/`;
- `sim/driver.py` (SimDriver: a measurement driver) -> `measure/sim_driver.py`;
- `sim/calibrate.py`, `sim/predict.py`, `sim/passive.py` (they run the protocol) -> `predict/`
  (`predict.calibrate`, `predict.grid`, `predict.passive`);
- `launch/providers.py` (drivers for the sweep controller) -> `sweep/providers.py`;
- `measure/reanalyse.py` (rebuilds a sweep's records) -> `sweep/reanalyse.py`;
- `analysis/prometheus.py` (reads the exporter's series back) -> `exporter/prometheus.py`;
- the launcher specs of `sweep/spec.py` (LocalLauncherSpec ... LAUNCHERS) -> `launch/specs.py`,
  where the launchers that read them live.

It refuses to run on a dirty work tree, and checks afterwards that nothing imports a module that
is gone. Test files move with their package where their folder is named after it.
"""

from __future__ import annotations

import argparse
import ast
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PKG = ROOT / "pdexporter"

# file or folder moves, old -> new (paths from the repository root)
MOVES: list[tuple[str, str]] = [
    ("pdexporter/engine", "pdexporter/client"),
    ("tests/unit/engine", "tests/unit/client"),
    ("tests/integration/engine", "tests/integration/client"),
    ("pdexporter/sim/driver.py", "pdexporter/measure/sim_driver.py"),
    ("pdexporter/sim/calibrate.py", "pdexporter/predict/calibrate.py"),
    ("pdexporter/sim/predict.py", "pdexporter/predict/grid.py"),
    ("pdexporter/sim/passive.py", "pdexporter/predict/passive.py"),
    ("pdexporter/launch/providers.py", "pdexporter/sweep/providers.py"),
    ("pdexporter/measure/reanalyse.py", "pdexporter/sweep/reanalyse.py"),
    ("pdexporter/analysis/prometheus.py", "pdexporter/exporter/prometheus.py"),
]

# module renames, old dotted -> new dotted (a package rename covers its modules)
CLIENT_MODULES = ("client", "http1", "identity", "iterlog", "kstamp", "metrics", "sse", "stream", "traces")
MODULES: list[tuple[str, str]] = [
    ("pdexporter.sim.driver", "pdexporter.measure.sim_driver"),
    ("pdexporter.sim.calibrate", "pdexporter.predict.calibrate"),
    ("pdexporter.sim.predict", "pdexporter.predict.grid"),
    ("pdexporter.sim.passive", "pdexporter.predict.passive"),
    ("pdexporter.launch.providers", "pdexporter.sweep.providers"),
    ("pdexporter.measure.reanalyse", "pdexporter.sweep.reanalyse"),
    ("pdexporter.analysis.prometheus", "pdexporter.exporter.prometheus"),
]

# the launcher specs leave sweep/spec.py for launch/specs.py (with the helpers they need)
SPEC_SOURCE, SPEC_TARGET = "pdexporter/sweep/spec.py", "pdexporter/launch/specs.py"
SPEC_NAMES = (
    "_Strict",
    "Seconds",
    "_unique",
    "H",
    "_engine_name",
    "EngineName",
    "MULTI_GPU_ENV",
    "SLOT_PLACEHOLDERS",
    "LocalLauncherSpec",
    "ExternalLauncherSpec",
    "SimLauncherSpec",
    "PairInstanceSpec",
    "PairLauncherSpec",
    "KubernetesLauncherSpec",
    "LauncherSpec",
    "_Blank",
    "_check_url",
    "LAUNCHERS",
)
SPEC_PUBLIC = tuple(n for n in SPEC_NAMES if not n.startswith("_") and n != "H")
SPEC_SHARED = ("_Strict", "Seconds", "_unique", "H", "_check_url")  # sweep/spec.py still uses these

# prose that names the old house, after the rewrite: (path, pattern, replacement)
LAYOUT = """    pdexporter/
      engines/    one adapter per engine (vLLM, SGLang, the embedded engine's), registered by name: every engine rule
      client/     talking to an engine: SSE, token-id prompts, auth, retries · /metrics parsing · traces · iteration log · who it is
      sim/        embedded engine: vLLM v1 scheduler, SGLang's policy (pure) · step-time model (pure) · profiles · core · server
      launch/     ways of getting an engine (local, external, sim, kubernetes, pair) and their sweep-file specs
      measure/    probes + injection protocol · window.py (pure maths) · records · results store · drivers (HTTP, P/D, in process)
      load/       synthetic production load (Poisson arrivals, ShareGPT-like mix)
      analysis/   table · cost models · break-even · criteria · plots · HTML report
      exporter/   live runner, passive mode, Prometheus metrics (and reading them back), OpenTelemetry spans, server + OTLP receiver
      sweep/      sweep files, controller, fast mode, the controller's providers, re-analysis
      predict/    the protocol on the embedded engine in virtual time: predicted grids, calibration, passive mode
      grafana/    dashboard builders and push
      doctor/     checks before measuring: pure verdicts · the I/O that gathers what they judge
      cli/        one thin module per command
"""  # noqa: E501 (verbatim data)
PROSE: list[tuple[str, str, str]] = [
    (
        "README.md",
        r"The folders follow the pipeline:\n\n    pdexporter/\n(?:      [^\n]*\n)+",
        "A package imports only the packages above it in this list (`tests/unit/test_layers.py`):\n\n"
        + LAYOUT,
    ),
    (
        "pdexporter/sim/__init__.py",
        r"- `driver`: `SimDriver`.*?\n- `predict`: [^\n]*\n",
        (
            "\nWhat runs a measurement on it lives above it: `measure.sim_driver` (the protocol's driver without\n"
            "HTTP) and `predict` (virtual-time grids, calibration to measured records, passive mode in process).\n"
        ),
    ),
]

LAYERS_TEST = '''"""One direction for imports between pdexporter's packages (README, "Layout"): each imports only
the packages below it in `LAYERS`, so the engine model (`sim`) knows nothing of measuring, the
client side nothing of the embedded engine, and no two packages import each other."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "pdexporter"

# bottom to top, one layer per entry (names in one entry may import each other: errors.py's
# messages redact URLs with _internal.redact, whose helpers raise its errors); a module at the
# package's top (errors.py, __main__.py) counts as a package
LAYERS = ("errors _internal", "engines", "client", "sim", "launch", "measure", "load", "analysis", "exporter",
          "sweep", "predict", "grafana", "doctor", "cli", "__main__")
RANK = {name: i for i, layer in enumerate(LAYERS) for name in layer.split()}


def _package(path: Path) -> str:
    rel = path.relative_to(PACKAGE).parts
    return rel[0] if len(rel) > 1 else rel[0].removesuffix(".py")


def _imported(path: Path) -> set[str]:
    out = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        names = ([node.module] if isinstance(node, ast.ImportFrom) and node.module and node.level == 0
                 else [a.name for a in node.names] if isinstance(node, ast.Import) else [])
        out |= {n.split(".")[1] for n in names if n.startswith("pdexporter.")}
    return out


def test_every_package_is_in_a_layer() -> None:
    found = {_package(p) for p in PACKAGE.rglob("*.py")} - {"__init__"}
    assert found <= set(RANK), f"place {sorted(found - set(RANK))} in LAYERS"


def test_imports_run_down() -> None:
    rank = RANK
    upward = sorted(
        f"{path.relative_to(PACKAGE.parent)} imports pdexporter.{target}"
        for path in PACKAGE.rglob("*.py") if _package(path) in rank
        for target in _imported(path)
        if target in rank and target != _package(path) and rank[target] > rank[_package(path)]
    )
    assert not upward, "imports that run back up:\\n" + "\\n".join(upward)
'''

TEXT_SUFFIXES = (".py", ".md", ".sh", ".yaml", ".yml", ".toml", ".cfg", ".txt")


def git(*args: str) -> str:
    return subprocess.run(["git", *args], cwd=ROOT, check=True, capture_output=True, text=True).stdout


def rewrite_text(text: str) -> str:
    """Every mention of a moved module: dotted imports and references, `short.module` in prose,
    and paths."""
    modules = "|".join(CLIENT_MODULES)
    # pdexporter.engine -> pdexporter.client (never pdexporter.engines, never a span attribute name)
    text = re.sub(rf"\bpdexporter\.engine\.({modules})\b", r"pdexporter.client.\1", text)
    text = re.sub(r"\bpdexporter\.engine(?=\s+import\b)", "pdexporter.client", text)
    text = re.sub(rf"(?<![\w.])`engine\.({modules})\b", r"`client.\1", text)
    text = re.sub(r"\bpdexporter/engine/", "pdexporter/client/", text)
    text = re.sub(r"\btests/(unit|integration)/engine/", r"tests/\1/client/", text)
    specs = "|".join(SPEC_PUBLIC)
    text = re.sub(rf"\b(pdexporter\.)?sweep\.spec\.({specs})\b", r"\1launch.specs.\2", text)
    for old, new in MODULES:
        text = re.sub(rf"\b{re.escape(old)}\b", new, text)
        short_old, short_new = old.removeprefix("pdexporter."), new.removeprefix("pdexporter.")
        text = re.sub(rf"(?<![\w.])`{re.escape(short_old)}\b", f"`{short_new}", text)
        text = text.replace(old.replace(".", "/") + ".py", new.replace(".", "/") + ".py")
        text = re.sub(
            rf"(?<![\w/]){re.escape(short_old.replace('.', '/'))}\.py\b",
            short_new.replace(".", "/") + ".py",
            text,
        )
    # `from pdexporter.sim import driver` style (a moved module imported from its old package)
    for old, new in MODULES:
        pkg, mod = old.rsplit(".", 1)
        new_pkg, new_mod = new.rsplit(".", 1)
        alias = f" as {mod}" if new_mod != mod else ""
        text = re.sub(
            rf"\bfrom {re.escape(pkg)} import {mod}\b(?! as)", f"from {new_pkg} import {new_mod}{alias}", text
        )
        text = re.sub(
            rf"\bfrom {re.escape(pkg)} import {mod} as\b", f"from {new_pkg} import {new_mod} as", text
        )
    return text


_IMPORT = re.compile(
    r"^(?P<indent>[ \t]*)from pdexporter\.sweep\.spec import (?P<names>\((?:[^()])*\)|[^\n]*)", re.MULTILINE
)


def split_spec_imports(text: str, in_spec: bool = False) -> str:
    """`from pdexporter.sweep.spec import A, LocalLauncherSpec` -> the launcher specs from launch.specs."""
    if in_spec:
        return text

    def repl(m: re.Match[str]) -> str:
        raw = m["names"].strip().strip("()")
        names = [n.strip() for n in raw.replace("\n", " ").split(",") if n.strip()]
        moved = [n for n in names if n.split(" as ")[0] in SPEC_PUBLIC]
        kept = [n for n in names if n not in moved]
        if not moved:
            return m.group(0)
        indent = m["indent"]
        out = []
        if kept:
            out.append(_from(indent, "pdexporter.sweep.spec", kept))
        out.append(_from(indent, "pdexporter.launch.specs", moved))
        return "\n".join(out)

    return _IMPORT.sub(repl, text)


def _from(indent: str, module: str, names: list[str]) -> str:
    line = f"{indent}from {module} import {', '.join(names)}"
    if len(line) <= 110:
        return line
    body = "".join(f"{indent}    {n},\n" for n in names)
    return f"{indent}from {module} import (\n{body}{indent})"


def _all(names: list[str]) -> str:
    return "__all__ = [\n" + "".join(f'    "{n}",\n' for n in names) + "]"


def carve_specs(dry: bool) -> None:
    """Cut the launcher specs out of sweep/spec.py into launch/specs.py (top-level definitions by
    name, in their order), each file importing what it uses from the other."""
    source = ROOT / SPEC_SOURCE
    target = ROOT / SPEC_TARGET
    if target.exists():
        print(f"{SPEC_TARGET}: exists, the specs have moved")
        return
    text = source.read_text(encoding="utf-8")
    tree = ast.parse(text)
    lines = text.splitlines(keepends=True)
    spans: list[tuple[int, int, str]] = []
    for node in tree.body:
        names = [t.id for t in getattr(node, "targets", []) if isinstance(t, ast.Name)]
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names = [node.target.id]
        if isinstance(node, (ast.ClassDef, ast.FunctionDef)):
            names = [node.name]
        hit = [n for n in names if n in SPEC_NAMES]
        if hit:
            start = node.lineno - 1
            # comments right above a definition go with it
            while start > 0 and lines[start - 1].lstrip().startswith("#"):
                start -= 1
            start -= len(getattr(node, "decorator_list", []) or [])
            spans.append((start, node.end_lineno or node.lineno, hit[0]))
    missing = set(SPEC_NAMES) - {n for _, _, n in spans}
    if missing:
        raise SystemExit(f"{SPEC_SOURCE}: no top-level {sorted(missing)}: the script needs updating")
    moved = "".join("".join(lines[a:b]) + "\n\n" for a, b, _ in spans)
    keep = [line for i, line in enumerate(lines) if not any(a <= i < b for a, b, _ in spans)]
    kept_text = re.sub(r"\n{4,}", "\n\n\n", "".join(keep))
    header = (
        '''"""The `launcher` of a sweep file: one pydantic schema per way of getting an engine (`local`,
`external`, `sim`, `kubernetes`, `pair`), beside the launchers that read them (docs/sweep.md).
`sweep.spec` holds the rest of the sweep file."""

from __future__ import annotations

import re
import shlex
from collections.abc import Hashable, Iterator, Mapping
from pathlib import Path
from typing import Annotated, Any, Literal, TypeVar

from pydantic import (
    AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, ValidationError, field_validator, model_validator,
)

from pdexporter._internal.bounds import MAX_DECODE_BATCH, MAX_REPS, MAX_RETRIES, MAX_SECONDS, MAX_TOKENS
from pdexporter._internal.redact import redact_argv, redact_env
from pdexporter._internal.validation import flag_error, format_validation_error
from pdexporter.engines import UNIDENTIFIED, adapter, check_pair, registered, sim_engine
from pdexporter.errors import ConfigError

__all__ = [
'''
        + "".join(f'    "{n}",\n' for n in sorted(SPEC_PUBLIC, key=lambda n: (not n.isupper(), n)))
        + "]\n\n\n"
    )
    # sweep.spec no longer exports the launcher specs: who needs them imports launch.specs
    kept_text = re.sub(
        r"__all__ = \[(.*?)\]",
        lambda m: _all([n for n in re.findall(r'"(\w+)"', m[1]) if n not in SPEC_NAMES]),
        kept_text,
        count=1,
        flags=re.DOTALL,
    )
    shared = ", ".join(SPEC_SHARED)
    kept_text = kept_text.replace(
        "from pdexporter.measure.protocol import ProtocolSettings\n",
        "from pdexporter.measure.protocol import ProtocolSettings\n"
        f"from pdexporter.launch.specs import {shared}\n"
        f"from pdexporter.launch.specs import {', '.join(SPEC_PUBLIC)}\n",
        1,
    )
    if dry:
        print(f"would move {len(spans)} definitions from {SPEC_SOURCE} to {SPEC_TARGET}")
        return
    target.write_text(header + moved.rstrip() + "\n", encoding="utf-8")
    source.write_text(kept_text, encoding="utf-8")
    git("add", SPEC_TARGET)
    print(f"moved {len(spans)} definitions from {SPEC_SOURCE} to {SPEC_TARGET}")


CREATED = (SPEC_TARGET, "pdexporter/predict/__init__.py", "tests/unit/test_layers.py")


def _unsorted_imports() -> set[str]:
    """Python files whose import blocks ruff would sort (I001), before anything moved."""
    out = subprocess.run(
        ["ruff", "check", "--select", "I001", "--output-format", "concise", "--exit-zero", "."],
        cwd=ROOT,
        check=False,
        capture_output=True,
        text=True,
    ).stdout
    return {line.split(":", 1)[0] for line in out.splitlines() if ".py:" in line}


def _moved_path(rel: str) -> str:
    for old, new in MOVES:
        if rel == old or rel.startswith(old + "/"):
            return new + rel[len(old) :]
    return rel


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--dry-run", action="store_true")
    args = parser.parse_args()
    if git("status", "--porcelain").strip() and not args.dry_run:
        raise SystemExit("the work tree is not clean: commit or stash first")
    unsorted = {_moved_path(p) for p in _unsorted_imports()}  # left as they are: not this script's to sort
    for old, new in MOVES:
        if not (ROOT / old).exists():
            print(f"{old}: gone ({new} {'exists' if (ROOT / new).exists() else 'missing'})")
            continue
        (ROOT / new).parent.mkdir(parents=True, exist_ok=True)
        if args.dry_run:
            print(f"would git mv {old} {new}")
            continue
        git("mv", old, new)
        print(f"git mv {old} {new}")
    predict_init = ROOT / "pdexporter/predict/__init__.py"
    if not args.dry_run and not predict_init.exists():
        predict_init.write_text(
            '''"""The measurement protocol run on the embedded engine (`pdexporter.sim`) in virtual time:
predicted grids (`grid`), a profile fitted to measured records (`calibrate`), passive mode beside a
synthetic load in process (`passive`). Its numbers are a model and say so (MODELLED)."""
''',
            encoding="utf-8",
        )
        git("add", str(predict_init.relative_to(ROOT)))
    carve_specs(args.dry_run)
    layers = ROOT / "tests/unit/test_layers.py"
    if not args.dry_run and not layers.exists():
        layers.write_text(LAYERS_TEST, encoding="utf-8")
        git("add", str(layers.relative_to(ROOT)))
    changed = 0
    rewritten: list[str] = []
    for rel in git("ls-files").splitlines():
        path = ROOT / rel
        if not rel.endswith(TEXT_SUFFIXES) or not path.is_file() or rel == "scripts/house_moves.py":
            continue
        text = path.read_text(encoding="utf-8")
        new = split_spec_imports(rewrite_text(text), in_spec=rel == SPEC_SOURCE)
        for where, pattern, replacement in PROSE:
            if rel == where:
                new, count = re.subn(pattern, lambda _m, r=replacement: r, new, count=1, flags=re.DOTALL)
                if not count:
                    print(f"{where}: the prose to rewrite is not there any more: edit it by hand")
        if new != text:
            changed += 1
            if rel.endswith(".py"):
                rewritten.append(rel)
            if not args.dry_run:
                path.write_text(new, encoding="utf-8")
    print(f"{'would rewrite' if args.dry_run else 'rewrote'} {changed} files")
    if args.dry_run:
        return
    # renamed imports sorted again where they were sorted before; the files this script writes formatted
    resort = [rel for rel in rewritten if rel not in unsorted and rel not in (SPEC_SOURCE, SPEC_TARGET)]
    if resort:
        subprocess.run(
            ["ruff", "check", "--fix", "--select", "I001", "--quiet", *resort], cwd=ROOT, check=False
        )
    subprocess.run(["ruff", "format", "--quiet", *CREATED], cwd=ROOT, check=False)
    # the two spec files import what they use from each other and nothing more
    subprocess.run(
        ["ruff", "check", "--fix", "--select", "F401,I001", "--quiet", SPEC_SOURCE, SPEC_TARGET],
        cwd=ROOT,
        check=False,
    )
    undefined = subprocess.run(
        ["ruff", "check", "--select", "F821,F811,F401", SPEC_SOURCE, SPEC_TARGET],
        check=False,
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    if undefined.returncode:
        print(undefined.stdout)
        sys.exit(1)
    gone = [m for m, _ in MODULES] + ["pdexporter.engine."]
    left = subprocess.run(
        [
            "git",
            "grep",
            "-nE",
            "|".join(re.escape(g) for g in gone),
            "--",
            "*.py",
            ":!scripts/house_moves.py",
        ],
        check=False,
        cwd=ROOT,
        capture_output=True,
        text=True,
    ).stdout
    stale = [line for line in left.splitlines() if "pdexporter.engine.modelled" not in line]
    if stale:
        print("still naming a moved module:\n" + "\n".join(stale))
        sys.exit(1)


if __name__ == "__main__":
    main()
