"""One direction for imports between pdexporter's packages (README, "Layout"): each imports only
the packages below it in `LAYERS`, so the engine model (`sim`) knows nothing of measuring, the
client side nothing of the embedded engine, and no two packages import each other."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "pdexporter"

# bottom to top, one layer per entry (names in one entry may import each other: errors.py's
# messages redact URLs with _internal.redact, whose helpers raise its errors); a module at the
# package's top (errors.py, __main__.py) counts as a package
LAYERS = (
    "errors _internal",
    "engines",
    "client",
    "sim",
    "launch",
    "measure",
    "load",
    "analysis",
    "exporter",
    "sweep",
    "predict",
    "grafana",
    "doctor",
    "cli",
    "__main__",
)
RANK = {name: i for i, layer in enumerate(LAYERS) for name in layer.split()}


def _package(path: Path) -> str:
    rel = path.relative_to(PACKAGE).parts
    return rel[0] if len(rel) > 1 else rel[0].removesuffix(".py")


def _imported(path: Path) -> set[str]:
    out = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        names = (
            [node.module]
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0
            else [a.name for a in node.names]
            if isinstance(node, ast.Import)
            else []
        )
        out |= {n.split(".")[1] for n in names if n.startswith("pdexporter.")}
    return out


def test_every_package_is_in_a_layer() -> None:
    found = {_package(p) for p in PACKAGE.rglob("*.py")} - {"__init__"}
    assert found <= set(RANK), f"place {sorted(found - set(RANK))} in LAYERS"


def test_imports_run_down() -> None:
    rank = RANK
    upward = sorted(
        f"{path.relative_to(PACKAGE.parent)} imports pdexporter.{target}"
        for path in PACKAGE.rglob("*.py")
        if _package(path) in rank
        for target in _imported(path)
        if target in rank and target != _package(path) and rank[target] > rank[_package(path)]
    )
    assert not upward, "imports that run back up:\n" + "\n".join(upward)
