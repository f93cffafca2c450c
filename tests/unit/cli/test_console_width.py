"""Output in a pipe or a log is not laid out on 80 columns (issue 31: tables cut at 80 columns,
"aggregate_interferen…"): where no terminal says its width, the CLI's consoles are wide; $COLUMNS,
when set, still decides."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from pdexporter.cli._common import UNBOUNDED_WIDTH, make_console

ROOT = Path(__file__).resolve().parents[3]
RESULTS = ROOT / "results" / "h200-vllm0.22-qwen3-coder-30b-a3b-small-p"


def test_a_table_in_a_pipe_comes_out_whole(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}
    env["PYTHONPATH"] = str(ROOT)
    done = subprocess.run(
        [sys.executable, "-m", "pdexporter", "compare", str(RESULTS), str(RESULTS), "--out", str(tmp_path),
         "--no-plots"],
        cwd=tmp_path, env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True,  # both pipes
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    rows = [line for line in done.stderr.splitlines() if line.startswith("│")]
    assert any("│ aggregate_interference_ms │" in row for row in rows), done.stderr
    assert "…" not in done.stderr
    assert max(len(row) for row in rows) > 80  # wider than rich's default when it knows no width


@pytest.mark.parametrize("stderr", [False, True], ids=["stdout", "stderr"])
def test_columns_wins_and_no_terminal_is_wide(stderr: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    # pytest captures both streams: neither is a terminal here
    monkeypatch.delenv("COLUMNS", raising=False)
    assert make_console(stderr=stderr).width == UNBOUNDED_WIDTH
    monkeypatch.setenv("COLUMNS", "61")
    assert make_console(stderr=stderr).width == 61
