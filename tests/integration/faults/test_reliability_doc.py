"""docs/reliability.md's fault table names the tests that hold each behaviour: every name must exist
(a renamed or deleted test would leave the table promising what nothing checks)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
SHORT = {"M": "test_faults_measure.py", "S": "test_faults_sweep.py", "R": "test_faults_run.py"}


def _tests_in(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    return {n.name for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
            and n.name.startswith("test_")}


def test_every_test_the_fault_table_names_exists() -> None:
    doc = (ROOT / "docs" / "reliability.md").read_text()
    here = Path(__file__).parent
    named = 0
    for file, name in re.findall(r"`(?:([\w/]+\.py|[MSR])::)(test_\w+?)(?:\.\.\.|\[[^\]]*\])?`", doc):
        path = here / SHORT[file] if file in SHORT else (ROOT / file if "/" in file else here / file)
        assert path.is_file(), f"{file}: no such test file"
        tests = _tests_in(path)
        if name.endswith("_"):  # an abbreviated name ("test_run_killed_..."): a prefix
            assert any(t.startswith(name) for t in tests), f"{path.name}: no test starting {name}"
        else:
            assert name in tests, f"{path.name}: no test {name}"
        named += 1
    assert named >= 30
