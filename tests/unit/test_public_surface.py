"""Every module outside the CLI states its public names in `__all__`, and each of them exists."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "pdexporter"
MODULES = sorted(
    ".".join(("pdexporter", *path.relative_to(PACKAGE).with_suffix("").parts)).removesuffix(".__init__")
    for path in PACKAGE.rglob("*.py")
    if "cli" not in path.relative_to(PACKAGE).parts and path.name != "__main__.py"
)


def _defines_public_names(module: str) -> bool:
    path = PACKAGE.joinpath(*module.split(".")[1:])
    path = path / "__init__.py" if path.is_dir() else path.with_suffix(".py")
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and not node.name.startswith("_"):
            return True
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and not t.id.startswith("_") for t in node.targets
        ):
            return True
    return False


@pytest.mark.parametrize("name", MODULES)
def test_public_names_are_listed_and_exist(name: str) -> None:
    module = importlib.import_module(name)
    if not _defines_public_names(name) and not hasattr(module, "__all__"):
        return  # a package docstring, nothing of its own to list
    assert hasattr(module, "__all__"), f"{name}: no __all__"
    missing = [n for n in module.__all__ if not hasattr(module, n)]
    assert not missing, f"{name}.__all__ names what it does not define: {missing}"
    assert len(set(module.__all__)) == len(module.__all__), f"{name}.__all__ lists a name twice"
