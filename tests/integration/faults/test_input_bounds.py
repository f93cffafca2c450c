"""Every number from a user or a file is bounded, every path from a sweep file stays under the output
root, and a results directory holding a bad record is one line naming the file (issue 13's 23
malformed sweep files found tracebacks, runs that could not end, and a directory `export-table`
and `report` crashed on for good). The bounds and why: pdexporter/_internal/bounds.py."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.helpers import run_cli as run_cli_here
from tests.integration.faults.faultkit import error_line, run_cli

pytestmark = pytest.mark.integration

GRID = "grid: {chunk_sizes: [2048], decode_batch_sizes: [1], new_prefill_tokens: [64]}\n"


@pytest.mark.parametrize(("text", "fragment"), [
    ("grid: {chunk_sizes: [2048], decode_batch_sizes: [1], new_prefill_tokens: [1.0e+26]}\n",
     "grid.new_prefill_tokens[0]: must be <= 10000000"),
    ("grid: {chunk_sizes: [99999999999999999999], decode_batch_sizes: [1], new_prefill_tokens: [64]}\n",
     "grid.chunk_sizes[0]: must be <= 10000000 (got 99999999999999999999)"),
    ("grid: {chunk_sizes: [200000], decode_batch_sizes: [100000], new_prefill_tokens: [64]}\n",
     "grid.decode_batch_sizes[0]: must be <= 1024"),
    (GRID + "reps: 1.0e+9\n", "reps: must be <= 1000"),
    (GRID + "reps: 1e9\n", "reps: must be an integer"),  # YAML 1.1 reads 1e9 as a string
    (GRID + "retries: 1000000\n", "retries: must be <= 100"),
    (GRID + "cooldown: {seconds: 1.0e+12}\n", "cooldown.seconds: must be <= 604800"),
    (GRID + "read_timeout_s: 0\n", "read_timeout_s: must be > 0"),
    (GRID + "protocol: {decode_output_tokens: 99999999999}\n", "protocol.decode_output_tokens: must be <= 10000000"),
    (GRID + "name: ../../..\n", "name: must be one directory name"),
    (GRID + "output: results/../../elsewhere\n", "output: must not contain '..'"),
])
def test_a_bad_sweep_file_is_one_line_and_nothing_runs(text: str, fragment: str, tmp_path: Path, capsys) -> None:
    """The CLI in this process (its checks and messages are the child's: the file tests below and the
    e2e suite run the real one); each case in a child cost ~1 s of CPU twice."""
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    for command in (["sweep", str(path), "--out", str(tmp_path / "out")], ["sim", "sweep", str(path)]):
        code, _, err = run_cli_here(capsys, *command)
        assert code == 2
        line = error_line(err)
        assert line.startswith(f"pdexporter: error: {path}: ") and fragment in line, line
    assert not (tmp_path / "out").exists()


async def test_a_sweep_file_that_is_not_utf8_is_one_line(tmp_path: Path) -> None:
    path = tmp_path / "latin1.yaml"
    path.write_bytes(GRID.encode() + b"# caf\xe9 au lait\n")
    code, _, err, _ = await run_cli("sweep", str(path))
    assert code == 2
    assert f"{path}: line 2: not UTF-8 text (byte 0xe9" in error_line(err)


async def test_sim_sweep_never_writes_outside_results(tmp_path: Path) -> None:
    """`name: ../../..` would have put results/sim/{profile}/../../.. = the working directory's
    parent; the name is refused, and the default output is results/sim/{profile}/{name}."""
    work = tmp_path / "work"
    work.mkdir()
    good = tmp_path / "good.yaml"
    good.write_text(GRID + "name: small\nreps: 1\n")
    before = set(os.listdir(tmp_path))
    import asyncio
    import sys

    from tests.helpers import cli_env
    from tests.integration.faults.faultkit import ROOT

    proc = await asyncio.create_subprocess_exec(sys.executable, "-m", "pdexporter", "sim", "sweep", str(good),
                                                cwd=work, env=cli_env(), stdout=asyncio.subprocess.PIPE,
                                                stderr=asyncio.subprocess.PIPE)
    _, err = await proc.communicate()
    assert proc.returncode == 0, err.decode()
    assert set(os.listdir(tmp_path)) == before
    written = {p.relative_to(work).parts[:4] for p in work.rglob("*") if p.is_file()}
    assert written == {("results", "sim", "h200-qwen3-coder-30b-a3b", "small")}
    assert ROOT.is_dir()


async def test_a_record_out_of_bounds_is_one_line_naming_it_in_export_table_and_report(tmp_path: Path) -> None:
    """A record written by an older version with chunk size 99999999999999999999 made export-table
    and report crash on the directory for good (an int64 overflow deep in pandas)."""
    results = tmp_path / "results"
    sweep = tmp_path / "ok.yaml"
    sweep.write_text(GRID + "reps: 1\n")
    code, _, err, _ = await run_cli("sim", "sweep", str(sweep), "--out", str(results))
    assert code == 0, err
    good = results / "2048" / "D1_P64.json"
    data = json.loads(good.read_text())
    data["config"]["chunk_size"] = 99999999999999999999
    bad = results / "99999999999999999999" / "D1_P64.json"
    bad.parent.mkdir()
    bad.write_text(json.dumps(data))
    for command in ("export-table", "report"):
        code, _, err, _ = await run_cli(command, str(results))
        assert code == 2, err
        line = error_line(err)
        assert line == f"pdexporter: error: {bad}: config.chunk_size: must be <= 10000000 (got 99999999999999999999)"


async def test_a_record_that_is_not_utf8_is_one_line_naming_it(tmp_path: Path) -> None:
    results = tmp_path / "results"
    (results / "2048").mkdir(parents=True)
    bad = results / "2048" / "D1_P64.json"
    bad.write_bytes(b'{"config": "caf\xe9"}')
    code, _, err, _ = await run_cli("export-table", str(results))
    assert code == 2
    assert error_line(err) == f"pdexporter: error: {bad}: line 1: not UTF-8 text (byte 0xe9 at offset 15)"


async def test_read_timeout_options_are_checked_before_anything_runs(tmp_path: Path) -> None:
    path = tmp_path / "ok.yaml"
    path.write_text(GRID)
    code, _, err, _ = await run_cli("sweep", str(path), "--read-timeout", "soon", "--out", str(tmp_path / "out"))
    assert code == 2 and "--read-timeout 'soon': expected a duration" in error_line(err)
    code, _, err, _ = await run_cli("run", "--read-timeout", "0s", "--listen", "127.0.0.1:0")
    assert code == 2 and "--read-timeout '0s': must be > 0" in error_line(err)
    assert not (tmp_path / "out").exists()
