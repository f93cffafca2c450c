"""The engine seam is the only way in: no module outside `pdexporter/engines/` imports one of its
modules (`engines.vllm`, `engines.sglang`, `engines._registry`, ...); they import
`pdexporter.engines`, whose names are the registry and the rules it hands out by engine name."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[3] / "pdexporter"
ENGINES = PACKAGE / "engines"


def _imports(path: Path) -> list[tuple[int, str]]:
    out = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module:
            if node.module == "pdexporter.engines":
                out += [(node.lineno, f"pdexporter.engines.{a.name}") for a in node.names]
            else:
                out.append((node.lineno, node.module))
        elif isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
    return out


def _concrete(module: str) -> bool:
    """`pdexporter.engines.X` where X is one of the package's modules (not a name it exports)."""
    parts = module.split(".")
    return (
        len(parts) >= 3
        and parts[:2] == ["pdexporter", "engines"]
        and ((ENGINES / f"{parts[2]}.py").exists() or (ENGINES / parts[2]).is_dir())
    )


def test_nothing_outside_the_engines_package_imports_an_adapter_module() -> None:
    offenders = [
        f"{path.relative_to(PACKAGE.parent)}:{line}: {module}"
        for path in sorted(PACKAGE.rglob("*.py"))
        if ENGINES not in path.parents
        for line, module in _imports(path)
        if _concrete(module)
    ]
    assert not offenders, "import pdexporter.engines instead:\n" + "\n".join(offenders)


def test_the_check_sees_an_offender(tmp_path: Path) -> None:
    """The scan would catch each way of writing such an import."""
    for text in (
        "from pdexporter.engines.vllm import format_step\n",
        "import pdexporter.engines.sglang\n",
        "from pdexporter.engines import vllm\n",
        "from pdexporter.engines._registry import adapter\n",
    ):
        path = tmp_path / "m.py"
        path.write_text(text)
        assert any(_concrete(module) for _, module in _imports(path)), text
    path = tmp_path / "ok.py"
    path.write_text("from pdexporter.engines import adapter, IterationStep\n")
    assert not any(_concrete(module) for _, module in _imports(path))
