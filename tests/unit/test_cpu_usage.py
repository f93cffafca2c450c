"""tests/cpu_usage.py: the plugin measures a test's own CPU and its reaped subprocesses', and the summary adds
them up by area; a file that is not its rows is one line naming it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.cpu_usage import Usage, area, load, main, summary
from tests.helpers import cli_env

ROOT = Path(__file__).resolve().parents[2]

BUSY = """
import subprocess, sys

def test_busy_child():
    subprocess.run([sys.executable, "-c", "sum(range(30_000_000))"], check=True)

def test_idle():
    pass
"""


def test_the_plugin_counts_a_tests_subprocess_and_the_summary_reads_it(tmp_path: Path) -> None:
    (tmp_path / "test_busy.py").write_text(BUSY)
    usage = tmp_path / "usage"
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "tests.cpu_usage", "-p", "no:benchmark", "-p", "no:cacheprovider",
         str(tmp_path / "test_busy.py"), "--rootdir", str(tmp_path), "-c", "/dev/null"],
        cwd=ROOT, env={**cli_env(), "PDX_CPU_USAGE_DIR": str(usage), "PYTHONPATH": str(ROOT)},
        capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    rows = {r.test.split("::")[-1]: r for r in load(usage)}
    assert set(rows) == {"test_busy_child", "test_idle"}
    assert rows["test_busy_child"].children_s > 0.2 > rows["test_idle"].children_s  # a second of a loop, reaped
    assert rows["test_busy_child"].cpu_s > rows["test_idle"].cpu_s


def test_summary_by_area_and_the_largest() -> None:
    rows = [Usage("tests/integration/faults/test_a.py::t", 1.0, 9.0, 4.0),
            Usage("tests/unit/analysis/test_b.py::t", 2.0, 0.0, 2.0),
            Usage("tests/unit/test_c.py::t", 0.5, 0.0, 0.5)]
    assert [area(r.test) for r in rows] == ["tests/integration/faults", "tests/unit", "tests/unit"]
    text = summary(rows, top=2)
    assert text.startswith("3 tests: 12 CPU-s (in-process 4, subprocesses 9)")
    assert "     2.5  tests/unit" in text and "    10.0  tests/integration/faults" in text
    assert text.index("test_a.py") < text.index("test_b.py") and "test_c.py" not in text


def test_a_bad_row_is_one_line_naming_the_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "usage-1.jsonl").write_text(json.dumps({"test": "x", "self_s": 1.0}) + "\n")
    with pytest.raises(SystemExit) as caught:
        main([str(tmp_path)])
    assert str(caught.value).startswith(f"{tmp_path / 'usage-1.jsonl'}:1: not a usage row")
    assert main([str(tmp_path / "missing")]) == 2 and "usage:" in capsys.readouterr().err
