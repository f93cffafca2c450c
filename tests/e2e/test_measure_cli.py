"""`pdexporter measure` end to end: one-line errors, exit codes, nothing recorded is lost.

The runs against an engine are the real process; the points refused before anything runs are
argument checks, run by `pdexporter.cli.main` in this process (what `python -m pdexporter` calls:
the same exit code and stderr, a second of CPU less each)."""

from __future__ import annotations

import asyncio
import itertools
import json
import statistics
import sys
import time
from pathlib import Path

import pytest

from pdexporter._internal.atomic import read_json_gz
from pdexporter.measure.protocol import ProtocolSettings
from tests.helpers import free_port
from tests.helpers import run_cli as run_here
from tests.scripted_engine import ScriptedEngine

pytestmark = pytest.mark.e2e


async def run_cli(*args: str, timeout: float = 120) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "pdexporter", *args,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), timeout)
    return proc.returncode or 0, out.decode(), err.decode()


def _one_error_line(stderr: str) -> str:
    lines = [line for line in stderr.splitlines() if line.startswith("pdexporter: error:")]
    assert len(lines) == 1, stderr
    assert "Traceback" not in stderr, stderr
    return lines[0]


@pytest.mark.parametrize(
    "args, fragment",
    [
        (["-P", "0"], "-P/--new-prefill-tokens 0: must be >= 1"),
        (["-D", "-1"], "-D/--decode-batch-size -1: must be >= 0"),
        (["-D", "1024", "--chunk-size", "1024"], "take the whole step budget"),
        # Issue 13: numbers out of any sane range were tracebacks or runs that could not end
        (
            ["-P", "99999999999999999999"],
            "-P/--new-prefill-tokens 99999999999999999999: must be between 1 and 10000000",
        ),
        (["-D", "100000", "--chunk-size", "200000"], "-D/--decode-batch-size 100000: must be between 0 and 1024"),
        (["--chunk-size", "99999999999999999999"], "--chunk-size 99999999999999999999: must be between 1 and"),
        (["--reps", "1000000000"], "--reps 1000000000: must be between 1 and 1000"),
        (["--read-timeout", "0s"], "--read-timeout '0s': must be > 0"),
        (["--read-timeout", "soon"], "--read-timeout 'soon': expected a duration"),
        (["--decode-output-tokens", "99999999999"], "--decode-output-tokens 99999999999: must be <= 10000000"),
    ],
)
def test_bad_point_is_rejected_before_anything_runs(args: list[str], fragment: str, tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run_here(capsys, "measure", "--out", str(tmp_path), *args)
    assert code == 2
    assert fragment in _one_error_line(err)
    assert list(tmp_path.iterdir()) == []


async def test_unreachable_target(tmp_path: Path) -> None:
    url = f"http://127.0.0.1:{free_port()}"
    code, _, err = await run_cli("measure", "--target", url, "--out", str(tmp_path), "-D", "1", "-P", "16")
    assert code == 3
    line = _one_error_line(err)
    assert url in line and "cannot connect" in line


async def test_engine_rejecting_the_prompt_keeps_earlier_records(tmp_path: Path) -> None:
    earlier = tmp_path / "8192" / "D1_P16.json"
    earlier.parent.mkdir(parents=True)
    earlier.write_text('{"kept": true}\n')
    async with ScriptedEngine(behaviour="reject") as engine:
        code, _, err = await run_cli("measure", "--target", engine.url, "--out", str(tmp_path), "-D", "1", "-P", "16",
                                     "--no-resume")
    assert code == 3
    assert "maximum context length" in _one_error_line(err)
    assert json.loads(earlier.read_text()) == {"kept": True}


# The double's cadence: its sleeps run late on a loaded machine by a few ms, and the protocol's
# steadiness check (the last 8 intervals within 2x of each other) refused every window of a 2-ms
# double beside a CPU burner and five other test workers; at 10 ms the same lateness stays inside 2x.
CADENCE_S = 0.010


async def test_measure_writes_the_seed_layout_against_an_external_engine(tmp_path: Path) -> None:
    async with ScriptedEngine(cadence_s=CADENCE_S) as engine:
        code, out, err = await run_cli(
            "measure", "--target", engine.url, "--gpu", "test-double", "--out", str(tmp_path),
            "-B", "2048", "-D", "2", "-P", "64", "--reps", "2",
            "--decode-context-tokens", "64", "--decode-output-tokens", "80",
        )
    assert code == 0, err
    record_path = tmp_path / "2048" / "D2_P64.json"
    assert out.strip().endswith(str(record_path))
    record = json.loads(record_path.read_text())
    assert record["config"]["gpu"] == "test-double" and record["config"]["modelled"] is False
    assert record["summary"]["reps_done"] == 2
    assert {r["raw"] for r in record["reps"]} == {"raw/D2_P64_r0.json.gz", "raw/D2_P64_r1.json.gz"}
    assert (tmp_path / "2048" / "raw" / "D2_baseline.json.gz").exists()
    # the window settings it ran with, kept for `reanalyse` (the defaults may change, these records' may not)
    assert json.loads((tmp_path / "window.json").read_text())["window"] == ProtocolSettings().window_fields()
    # Phase 1's TPOT is the engine's cadence as it really ran: the double's sleeps run late on a
    # loaded machine (2 ms ones at 3.96 ms p50 beside a CPU burner), so it is compared with the double's
    # own write times of the first D = 2 probe streams, after the 16 warm-up tokens
    baseline = [written for body, written in engine.streams if body["max_tokens"] == 80][:2]
    engine_p50_ms = statistics.median(b - a for w in baseline for a, b in itertools.pairwise(w[16:])) / 1e6
    assert record["baseline"]["tpot_p50_ms"] == pytest.approx(engine_p50_ms, abs=0.25)
    assert record["baseline"]["tpot_p50_ms"] >= CADENCE_S * 1e3 * 0.9
    # The raw file places each window on the host's monotonic clock, so host-side samples line up.
    injected = [read_json_gz(tmp_path / "2048" / r["raw"])["t_inject_clock_ns"] for r in record["reps"]]
    assert 0 < injected[0] < injected[1] <= time.monotonic_ns()


async def test_the_engine_command_given_is_recorded_and_read_as_the_engine_it_started(tmp_path: Path) -> None:
    """`--engine-command` with --target: the records carry the command line as a launcher's do, secrets
    redacted; it gives the chunk size where -B does not; the fit reads its CUDA graphs from it (the largest
    capture size at or below B, here 1040 of [.., 512, 1040, 2064] at B = 2048); a contradiction is one line."""
    from pdexporter.analysis.table import samples_from_record
    from pdexporter.measure.records import RunRecord

    sizes = [*range(8, 513, 8), 1040, 2064]
    command = ("vllm serve /models/m --max-num-batched-tokens 2048 --api-key sk-s3cret "
               f"--compilation-config '{{\"cudagraph_capture_sizes\": {sizes}}}'")
    async with ScriptedEngine(cadence_s=CADENCE_S) as engine:
        code, out, err = await run_cli("measure", "--target", engine.url, "--engine", "vllm", "--engine-command",
                                       command, "--out", str(tmp_path), "-D", "1", "-P", "64", "--reps", "1",
                                       "--decode-context-tokens", "64", "--decode-output-tokens", "80")
        assert code == 0, err
        text = (tmp_path / "2048" / "D1_P64.json").read_text()
        assert "sk-s3cret" not in text + out + err
        record = RunRecord.model_validate_json(text)
        assert record.config.chunk_size_source == "given" and record.config.cuda_graphs is True
        assert record.config.engine_command[:6] == ["vllm", "serve", "/models/m", "--max-num-batched-tokens", "2048",
                                                    "--api-key"]
        assert record.config.engine_command[6] == "***"
        assert samples_from_record(record).graph_max_tokens == 1040
        code, _, err = await run_cli("measure", "--target", engine.url, "--engine-command", command, "-B", "4096",
                                     "--out", str(tmp_path / "x"), "-D", "1", "-P", "64")
    assert code == 2 and "--engine-command: it starts the engine with --max-num-batched-tokens 2048, but the chunk " \
        "size given is 4096" in _one_error_line(err)
    assert not (tmp_path / "x" / "4096").exists()


async def test_a_url_password_is_nowhere_in_records_or_output(tmp_path: Path) -> None:
    """Issue 24: URL userinfo was recorded (`config.engine_url`) and printed in error lines."""
    async with ScriptedEngine(cadence_s=CADENCE_S) as engine:
        url = engine.url.replace("http://", "http://alice:pw-s3cret@")
        code, out, err = await run_cli("measure", "--target", url, "--out", str(tmp_path), "-B", "2048", "-D", "1",
                                       "-P", "64", "--reps", "1", "--decode-context-tokens", "64",
                                       "--decode-output-tokens", "80")
    assert code == 0, err
    record = (tmp_path / "2048" / "D1_P64.json").read_text()
    assert "pw-s3cret" not in record + out + err
    assert json.loads(record)["config"]["engine_url"] == engine.url.replace("http://", "http://alice:***@")
    dead = f"http://alice:pw-s3cret@127.0.0.1:{free_port()}"
    code, out, err = await run_cli("measure", "--target", dead, "--out", str(tmp_path / "x"), "-D", "1", "-P", "16")
    assert code == 3 and "pw-s3cret" not in out + err and "cannot connect to http://127.0.0.1" in _one_error_line(err)


async def test_a_401_is_one_line_that_says_what_to_check(tmp_path: Path) -> None:
    async with ScriptedEngine(cadence_s=0.002, api_key="the-right-key") as engine:
        key = tmp_path / "key"
        key.write_text("sk-the-wrong-key\n")
        code, out, err = await run_cli("measure", "--target", engine.url, "--api-key-file", str(key),
                                       "--out", str(tmp_path), "-D", "1", "-P", "16")
    assert code == 3 and "sk-the-wrong-key" not in out + err
    assert "HTTP 401: the engine refused the credentials: check --api-key-file" in _one_error_line(err)
