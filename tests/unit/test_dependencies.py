"""Every package that pdexporter, its tests and its scripts import is declared in pyproject.toml:
by the package's dependencies, or, for the tests, by the `test` extras. Issue 31: in a fresh
virtual environment `mypy` could not find `click` (typer 0.26 stopped installing it) and a TLS test
needed `cryptography`; CI passed only because the machine had both. A package that comes only
through another one's dependencies is not declared: it goes when that one changes its mind."""

from __future__ import annotations

import ast
import importlib.metadata
import re
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SOURCES = ("pdexporter", "tests", "scripts")
# What the GPU machine's vLLM bundle provides (scripts/gpu/README.md), imported only by scripts that run there:
# not a dependency of pdexporter, and nothing on this side imports it (the scripts' dry runs take a test double)
GPU_MACHINE = {"torch"}


def canonicalize_name(name: str) -> str:
    """A distribution's name as PEP 503 compares them (`PyYAML` = `pyyaml`, `a_b` = `a-b`)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def _name(requirement: str) -> str:
    """`pandas>=2.1` -> pandas; `uvicorn[standard]; python_version < '4'` -> uvicorn."""
    match = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)", requirement)
    assert match, requirement
    return canonicalize_name(match.group(1))


def _declared() -> tuple[set[str], set[str]]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    runtime = {_name(r) for r in project["dependencies"]}
    test = {_name(r) for r in project["optional-dependencies"]["test"]}
    return runtime, runtime | test


def _files() -> list[Path]:
    return [p for top in SOURCES for p in (ROOT / top).rglob("*.py")] + [ROOT / "conftest.py"]


def _local_names(files: list[Path]) -> set[str]:
    """Modules of this checkout imported by their bare name (a script's sibling, tests/benchmarks'
    helpers, the top packages)."""
    return {p.stem for p in files} | {d.name for p in files for d in p.relative_to(ROOT).parents if d.name}


def _imports(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names


def test_every_imported_package_is_declared() -> None:
    runtime, with_tests = _declared()
    files = _files()
    local = _local_names(files)
    providers = importlib.metadata.packages_distributions()
    missing = []
    for path in files:
        allowed = runtime if path.relative_to(ROOT).parts[0] == "pdexporter" else with_tests
        gpu = GPU_MACHINE if path.relative_to(ROOT).parts[:2] == ("scripts", "gpu") else set()
        for name in sorted(_imports(path) - set(sys.stdlib_module_names) - local - gpu):
            dists = {canonicalize_name(d) for d in providers.get(name, [])}
            if not dists:
                missing.append(f"{path.relative_to(ROOT)}: `{name}` is not installed (declare its package)")
            elif not dists & allowed:
                where = "dependencies" if allowed is runtime else "dependencies or the test extras"
                missing.append(f"{path.relative_to(ROOT)}: `{name}` ({', '.join(sorted(dists))}) is not in the "
                               f"{where}")
    assert not missing, "\n".join(missing)
