"""Temporary files that killed writers leave (issue 13: 5 of 61 random kills left `*.tmp` files that
resume never removed). Real processes: a writer killed with SIGKILL between writing its temporary
file and renaming it, a live writer caught at the same moment, then `measure` and `sweep` resuming."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from pdexporter._internal.atomic import LEGACY_TMP_AGE_S, clean_stale, is_stale_tmp
from tests.helpers import cli_env, wait_until

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[3]

# A writer that stops between the temporary file and its rename (as a kill at that moment finds it).
WRITER = textwrap.dedent("""\
    import os, sys, time
    import pdexporter._internal.atomic as atomic
    os.replace = lambda *args: time.sleep(600)
    atomic.atomic_write_json(sys.argv[1], {"half": "written"})
""")


def _writer(target: Path) -> tuple[subprocess.Popen[bytes], Path]:
    proc = subprocess.Popen([sys.executable, "-c", WRITER, str(target)], cwd=ROOT, env=cli_env())
    found: list[Path] = []

    def written() -> bool:
        found[:] = list(target.parent.glob(f".{target.name}.pdx-*.tmp"))
        return bool(found)

    assert wait_until(written, 30), "the writer never wrote its temporary file"
    return proc, found[0]


def test_temporary_files_name_their_writer_and_only_dead_writers_lose_them(tmp_path: Path) -> None:
    target = tmp_path / "results" / "8192" / "D4_P8192.json"
    target.parent.mkdir(parents=True)
    dead, dead_tmp = _writer(target)
    os.kill(dead.pid, signal.SIGKILL)
    dead.wait(10)
    live, live_tmp = _writer(tmp_path / "results" / "8192" / "D8_P8192.json")
    try:
        assert f".pdx-{dead.pid}-" in dead_tmp.name
        assert is_stale_tmp(dead_tmp) and not is_stale_tmp(live_tmp)
        assert clean_stale(tmp_path / "results") == [dead_tmp]
        assert not dead_tmp.exists() and live_tmp.exists() and not target.exists()
    finally:
        live.kill()
        live.wait(10)


def test_unnamed_temporary_files_of_older_versions_go_after_an_hour(tmp_path: Path) -> None:
    old, fresh = tmp_path / ".D4_P8192.json.abcd1234.tmp", tmp_path / ".D4_P512.json.efgh5678.tmp"
    old.write_text("{")
    fresh.write_text("{")
    past = time.time() - LEGACY_TMP_AGE_S - 60
    os.utime(old, (past, past))
    unrelated = tmp_path / ".notes.tmp"  # not a name pdexporter writes
    unrelated.write_text("keep")
    assert clean_stale(tmp_path) == [old]
    assert fresh.exists() and unrelated.exists()


async def test_measure_and_sweep_remove_them_when_they_resume(tmp_path: Path) -> None:
    from tests.integration.faults.faultkit import measure, run_cli
    from tests.scripted_engine import ScriptedEngine

    out = tmp_path / "out"
    (out / "2048").mkdir(parents=True)
    dead, stale = _writer(out / "2048" / "D2_P64.json")
    os.kill(dead.pid, signal.SIGKILL)
    dead.wait(10)
    async with ScriptedEngine(cadence_s=0.01) as engine:
        code, err, _ = await measure(engine, out)
    assert code == 0, err
    assert not stale.exists() and not list(out.rglob("*.tmp"))

    sweep = tmp_path / "sweep.yaml"
    sweep.write_text("grid: {chunk_sizes: [2048], decode_batch_sizes: [1], new_prefill_tokens: [512]}\nreps: 1\n")
    results = tmp_path / "sim"
    (results / "2048" / "raw").mkdir(parents=True)
    dead, stale = _writer(results / "2048" / "raw" / "D1_P512_r0.json.gz")
    os.kill(dead.pid, signal.SIGKILL)
    dead.wait(10)
    code, _, err, _ = await run_cli("sim", "sweep", str(sweep), "--out", str(results))
    assert code == 0, err
    assert "removed 1 temporary file(s) a killed run left" in err
    assert not stale.exists() and not list(results.rglob("*.tmp"))


def test_scratch_directories_of_a_killed_run_are_removed_by_the_next(tmp_path: Path) -> None:
    """Issue 24: `kill -9` of `run` left `/tmp/pdexporter-sim-*` (the embedded engine's log and
    ready file) for ever. The directory now names its owner (pid and start time), and the next
    embedded engine removes those whose owner is gone; a live owner's stays."""
    from pdexporter.launch.sim import SCRATCH_PREFIX, clean_stale_scratch
    from tests.helpers import free_port

    env = {**cli_env(), "TMPDIR": str(tmp_path)}
    proc = subprocess.Popen([sys.executable, "-m", "pdexporter", "run", "-D", "1", "--inject-every", "off",
                             "--listen", f"127.0.0.1:{free_port()}"], cwd=ROOT, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        assert wait_until(
            lambda: any((p / "sim-8192.ready.json").exists() for p in tmp_path.glob(f"{SCRATCH_PREFIX}*")), 90
        ), "the embedded engine never got ready"
        (scratch,) = tmp_path.glob(f"{SCRATCH_PREFIX}{proc.pid}-*")
        assert clean_stale_scratch(tmp_path) == [] and scratch.is_dir()  # its owner is alive
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)
    finally:
        proc.kill()
    assert scratch.is_dir()  # what a kill -9 leaves
    legacy = tmp_path / f"{SCRATCH_PREFIX}abc123"  # an older pdexporter's: no owner in the name
    legacy.mkdir()
    os.utime(legacy, (time.time() - 7200, time.time() - 7200))
    assert sorted(clean_stale_scratch(tmp_path)) == sorted([scratch, legacy])
    assert not scratch.exists() and not legacy.exists()
