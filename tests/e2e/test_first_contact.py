"""A new user's first hour (issue 16): each message they met, as the CLI prints it now.

Servers are real (the embedded engine, Python's own http.server answering 404 with its HTML page).
What a process does is run as one: the measurement cut short with SIGINT, `run` waiting for an
engine, Parquet without pyarrow, one option error and the version. The other messages come from
commands that end in argument parsing or in a short analysis: they run `pdexporter.cli.main` in
this process (`pdx_here`: what `python -m pdexporter` calls, in the directory `_pdx` gives it, on
250 columns), each a second of CPU less than a process; their exit code, stdout and stderr are the
same text.
"""

from __future__ import annotations

import http.server
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from pdexporter import __version__
from pdexporter.analysis.synthetic import SyntheticTruth, seed_grid, synthetic_records
from pdexporter.measure.store import ResultsStore
from tests.helpers import cli_here

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "COLUMNS": "250", "PYTHONPATH": str(ROOT)}


def _pdx(*args: str, cwd: Path = ROOT, timeout: float = 120, env: dict[str, str] | None = None
         ) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "pdexporter", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=timeout, env=env or ENV)


PdxHere = Callable[..., subprocess.CompletedProcess[str]]


@pytest.fixture
def pdx_here(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> PdxHere:
    """`pdexporter ARGS` in this process (`cli.main`), as `_pdx` runs it: in `cwd` (the repository
    root), on 250 columns; its exit code, stdout and stderr as a finished process's."""
    return cli_here(capsys, monkeypatch, columns=250, cwd=ROOT)


def _error_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("pdexporter: ")]


def _one_line_error(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode != 0, result.stdout
    assert "Traceback" not in result.stderr and "╭" not in result.stderr, result.stderr
    lines = _error_lines(result.stderr)
    assert len(lines) == 1, result.stderr
    return lines[0]


# --- the command itself -----------------------------------------------------------------------


def test_version_prints_the_version() -> None:
    result = _pdx("--version")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == f"pdexporter {__version__}"


def test_bare_command_prints_help_and_succeeds(pdx_here: PdxHere) -> None:
    result = pdx_here()
    assert result.returncode == 0, result.stderr
    assert "Usage: pdexporter" in result.stdout and "measure" in result.stdout and "doctor" in result.stdout
    assert result.stderr == ""


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["measure", "--reps", "0"], "pdexporter: error: --reps 0: must be >= 1 (see pdexporter measure --help)"),
        (["decide", "-D", "-1", "-P", "100"],
         "pdexporter: error: --decode-batch-size -1: must be >= 0 (see pdexporter decide --help)"),
        (["run", "--decode-batch-size", "four"],
         "pdexporter: error: --decode-batch-size four: must be an integer (see pdexporter run --help)"),
        (["measure", "--no-such-flag"], "pdexporter: error: No such option: --no-such-flag"),
    ],
)
def test_option_errors_are_one_line_not_a_box(args: list[str], expected: str, pdx_here: PdxHere) -> None:
    result = _pdx(*args) if args[0] == "run" else pdx_here(*args)  # one in a process, the others here
    assert result.returncode == 2
    assert _one_line_error(result).startswith(expected)
    assert result.stderr.strip() == _one_line_error(result)  # nothing else: no usage block, no box


def test_unknown_profile_fails_before_start_up_with_one_plain_line(pdx_here: PdxHere) -> None:
    started = time.monotonic()
    result = pdx_here("run", "--profile", "nope", "--listen", "127.0.0.1:0")
    line = _one_line_error(result)
    assert result.returncode == 2
    assert line.startswith("pdexporter: error: --profile 'nope': unknown profile; shipped: ")
    assert line.count("error:") == 1
    assert "metrics on" not in result.stderr and "probe streams on" not in result.stderr  # nothing started
    assert time.monotonic() - started < 30


# --- a server that is not an engine ---------------------------------------------------------


@pytest.fixture(scope="module")
def html_404(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """Python's http.server on an empty directory: every path answers 404 with an HTML page."""
    root = tmp_path_factory.mktemp("empty-site")
    handler = lambda *a, **k: http.server.SimpleHTTPRequestHandler(*a, directory=str(root), **k)  # noqa: E731
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.RequestHandlerClass.log_message = lambda *a, **k: None  # type: ignore[attr-defined]
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.parametrize(
    "args",
    [
        # run waits for an engine that answers an error (a vLLM still loading): --engine-wait ends it
        ["run", "--target", "{url}", "--listen", "127.0.0.1:0", "--engine-wait", "2s"],
        ["measure", "--target", "{url}", "--out", "{tmp}"],
        ["dashboards", "push", "--grafana-url", "{url}"],
    ],
    ids=["run", "measure", "dashboards-push"],
)
def test_an_html_404_page_becomes_one_short_line(html_404: str, tmp_path: Path, args: list[str],
                                                 pdx_here: PdxHere) -> None:
    argv = [a.format(url=html_404, tmp=tmp_path) for a in args]
    result = _pdx(*argv) if args[0] == "run" else pdx_here(*argv)  # `run` waits for the engine in a process
    line = _one_line_error(result)
    assert "404" in line and "an HTML page (Error response" in line, line
    assert "<" not in line and "DOCTYPE" not in line, line
    assert len(line) < 400, line
    assert "DOCTYPE" not in result.stderr and "<html" not in result.stderr.lower(), result.stderr


def test_dashboards_generate_outside_a_checkout_needs_out(tmp_path: Path, pdx_here: PdxHere) -> None:
    result = pdx_here("dashboards", "generate", cwd=tmp_path)
    line = _one_line_error(result)
    assert "--out not given" in line and "pass --out DIR" in line
    assert not (tmp_path / "dashboards").exists()
    result = pdx_here("dashboards", "generate", "--out", str(tmp_path / "boards"), "--chart", str(tmp_path / "none"),
                      cwd=tmp_path)
    # --chart that is not there is refused, --out alone works
    assert result.returncode == 2 and "--chart" in result.stderr
    result = pdx_here("dashboards", "generate", "--out", str(tmp_path / "boards"), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert sorted(p.name for p in (tmp_path / "boards").glob("*.json")) == [
        "pdexporter-interference-map.json", "pdexporter-live.json"]


# --- a real measurement, cut short with Ctrl-C, then analysed -------------------------------


@pytest.fixture(scope="module")
def interrupted_measure(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, subprocess.CompletedProcess[str]]:
    """`measure` on the embedded engine, SIGINT once a repetition is on disk."""
    out = tmp_path_factory.mktemp("measured")
    record = out / "2048" / "D2_P3000.json"
    proc = subprocess.Popen([sys.executable, "-m", "pdexporter", "measure", "-B", "2048", "-D", "2", "-P", "3000",
                             "--reps", "50", "--out", str(out)], cwd=ROOT, env=ENV, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 150
        while time.monotonic() < deadline and proc.poll() is None:
            if record.exists() and json.loads(record.read_text()).get("reps"):
                break
            time.sleep(0.5)
        assert proc.poll() is None, proc.communicate()
        proc.send_signal(signal.SIGINT)
        stdout, stderr = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return out, subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr)


def test_ctrl_c_in_measure_says_what_was_kept(interrupted_measure: tuple[Path, subprocess.CompletedProcess[str]]
                                              ) -> None:
    out, result = interrupted_measure
    assert result.returncode == 130
    record = out / "2048" / "D2_P3000.json"
    kept = len(json.loads(record.read_text())["reps"])
    assert kept >= 1
    lines = _error_lines(result.stderr)
    assert lines == [f"pdexporter: interrupted: {kept} repetition{'s' if kept != 1 else ''} recorded in {record}; "
                     "the same command resumes from there"], result.stderr
    assert "Traceback" not in result.stderr


def test_one_modelled_point_analysed_without_doubled_words_or_n_a(
        interrupted_measure: tuple[Path, subprocess.CompletedProcess[str]], tmp_path: Path, pdx_here: PdxHere) -> None:
    out, _ = interrupted_measure
    result = pdx_here("export-table", str(out), "--no-plots", "--out", str(tmp_path))
    assert result.returncode == 0, result.stderr
    assert "MODELLED DATA: produced by pdexporter's embedded engine" in result.stderr
    assert "MODELLED: MODELLED" not in result.stderr and "MODELLED DATA: MODELLED" not in result.stderr
    assert "1 grid point, " in result.stderr
    assert "not enough points for a held-out fit" in result.stderr
    assert "n/a vs n/a" not in result.stderr and "held-out R^2 n/a" not in result.stderr

    decided = pdx_here("decide", "-D", "2", "-P", "3000", "-B", "2048", "--results", str(out))
    assert decided.returncode == 0, decided.stderr
    assert "  modelled at this point: " in decided.stdout and "measured at this point" not in decided.stdout
    assert "2 chunks of <= 2046 tokens" in decided.stdout and "(not enough points for a held-out fit)" in decided.stdout


H200_DECISION = ROOT / "results" / "h200-vllm0.22-qwen3-coder-30b-a3b" / "decision.json"


def test_decide_says_one_chunk_and_out_of_range_in_one_line(pdx_here: PdxHere) -> None:
    result = pdx_here("decide", "-D", "100", "-P", "100", "-B", "8192", "--model", str(H200_DECISION))
    assert result.returncode == 0, result.stderr
    assert "1 chunk of <= 8092 tokens" in result.stdout and "1 chunks" not in result.stdout
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    warning = [line for line in lines if line.startswith("pdexporter:")]
    assert len(warning) == 1 and warning[0].startswith("pdexporter: warning: MODELLED beyond what was measured ("), (
        warning
    )
    # the other note: what the intervals rest on (this document carries no campaign variation)
    assert [line for line in lines if line not in warning] == [
        "intervals: this campaign's repetitions only (no campaign variation carried: export-table "
        "--campaign-variation)"]
    assert "P=100 (fitted 512..32768)" in warning[0] and "D=100 (fitted 1..12)" in warning[0]


def test_readme_decide_example_is_what_the_command_prints(pdx_here: PdxHere) -> None:
    """The README's decide block: the command line, then `# ` lines that are its stdout."""
    readme = (ROOT / "README.md").read_text()
    block = re.search(r"```bash\n(pdexporter decide [^\n]+)\n((?:# [^\n]*\n)+)```", readme)
    assert block, "README has no decide example"
    command, shown = block.group(1), [line[2:] for line in block.group(2).splitlines()]
    result = pdx_here(*command.split()[1:])
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == shown


def test_negative_coefficients_get_a_word(tmp_path: Path, pdx_here: PdxHere) -> None:
    truth = SyntheticTruth(alpha1_ms_per_decode=-0.6)  # a mixed step that shrinks as D grows
    grid = seed_grid(chunks=(2048, 8192), decodes=(1, 4, 12), prefills=(512, 4096, 16384))
    store = ResultsStore(tmp_path / "results")
    for record in synthetic_records(truth, grid, reps=2):
        store.save_record(record)
    result = pdx_here("export-table", str(tmp_path / "results"), "--no-plots")
    assert result.returncode == 0, result.stderr
    (line,) = [line for line in result.stderr.splitlines() if line.strip().startswith("alpha1_ms_per_decode = ")]
    value = float(line.split("=")[1].split()[0])
    assert value < 0, line
    assert "(negative: larger decode batches shorten the mixed step" in line, line
    positive = [line for line in result.stderr.splitlines() if re.match(r"\s+\w+ = [0-9]", line)]
    assert positive and not [line for line in positive if "negative" in line]


def test_parquet_is_written_by_a_plain_install_or_its_absence_said(tmp_path: Path) -> None:
    """pyarrow is a dependency now; where it cannot be imported, one line says so."""
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert any(re.match(r"pyarrow\b", r) for r in project["dependencies"])  # a plain `pip install -e .` has it
    store = ResultsStore(tmp_path / "results")
    for record in synthetic_records(SyntheticTruth(), [(8192, 4, 4096), (8192, 4, 16384)], reps=2):
        store.save_record(record)
    done = _pdx("export-table", str(tmp_path / "results"), "--no-plots", "--out", str(tmp_path / "a"))
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "a" / "interference_table.parquet").is_file() and "Parquet" not in done.stderr

    # A TEST DOUBLE of an environment without pyarrow: a package of that name that fails to import.
    shadow = tmp_path / "no-pyarrow" / "pyarrow"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text("raise ImportError('no pyarrow here (test double)')\n")
    env = {**ENV, "PYTHONPATH": f"{shadow.parent}{os.pathsep}{ROOT}"}
    done = _pdx("export-table", str(tmp_path / "results"), "--no-plots", "--out", str(tmp_path / "b"), env=env)
    assert done.returncode == 0, done.stderr
    assert not (tmp_path / "b" / "interference_table.parquet").exists()
    assert (tmp_path / "b" / "interference_table.csv").is_file()
    notes = [line for line in done.stderr.splitlines() if "Parquet" in line]
    assert notes == ["no Parquet written: pyarrow cannot be imported (pip install pyarrow); the CSV has the same "
                     "table"], done.stderr
