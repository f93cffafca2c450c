"""One vocabulary across commands (issue 16): the same flag for D, P and B everywhere, the old
names still working for a release, one duration syntax, help without `<bool>` or `{arg}`, and
errors blamed on what the user typed (the flag, or the misspelt key of a file).

The commands that run something (the exporter under its old flag names, a sweep narrowed to one
chunk size against a real `pdexporter sim serve` over HTTP, a misspelt sweep key) run the real
`pdexporter` process. The help texts and the flag errors, ~50 commands that end in argument parsing,
run `pdexporter.cli.main` in this process (`pdx_here`: what `python -m pdexporter` calls, from the
repository root, on 250 columns as `_pdx` gives them), each a second of CPU less than a process;
their exit code, stdout and stderr are the same text.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import typer.main
import yaml

from pdexporter.cli import app
from pdexporter.cli._vocab import B_FLAGS, D_FLAGS, DEPRECATED, P_FLAGS
from pdexporter.measure.store import ResultsStore
from tests.helpers import cli_here, free_port

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "COLUMNS": "250", "PYTHONPATH": str(ROOT)}


def _pdx(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "pdexporter", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout, env=ENV)


PdxHere = Callable[..., subprocess.CompletedProcess[str]]


@pytest.fixture
def pdx_here(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> PdxHere:
    """`pdexporter ARGS` in this process (`cli.main`), as `_pdx` runs it: from the repository root,
    on 250 columns; its exit code, stdout and stderr as a finished process's."""
    return cli_here(capsys, monkeypatch, columns=250, cwd=ROOT)


def _commands() -> Iterator[tuple[str, object]]:
    """Every leaf command of the real command tree, as (its path, its click command)."""
    def walk(group: object, path: str) -> Iterator[tuple[str, object]]:
        for name, cmd in sorted(group.commands.items()):  # type: ignore[attr-defined]
            if hasattr(cmd, "commands"):
                yield from walk(cmd, f"{path} {name}")
            else:
                yield f"{path} {name}".strip(), cmd
    yield from walk(typer.main.get_command(app), "")


COMMANDS = dict(_commands())


# --- one name per concept ---------------------------------------------------------------------


def test_d_p_b_are_the_same_flags_in_every_command() -> None:
    short_to_long = {"-D": D_FLAGS[0], "-P": P_FLAGS[0], "-B": B_FLAGS[0]}
    seen: dict[str, list[str]] = {short: [] for short in short_to_long}
    for path, cmd in COMMANDS.items():
        for param in cmd.params:  # type: ignore[attr-defined]
            opts = set(param.opts) | set(param.secondary_opts)
            for short, long in short_to_long.items():
                if short in opts:
                    assert long in opts, f"pdexporter {path}: {short} is {sorted(opts)}, expected {long}"
                    seen[short].append(path)
                elif long in opts:
                    assert short in opts, f"pdexporter {path}: {long} has no {short}"
            assert not opts & set(DEPRECATED), f"pdexporter {path} still shows {sorted(opts & set(DEPRECATED))}"
    # the commands the vocabulary is about all have them
    assert {"run", "measure", "decide", "thresholds"} <= set(seen["-D"])
    assert {"run", "measure", "decide"} <= set(seen["-P"])
    assert {"run", "measure", "decide", "thresholds", "sweep", "doctor", "sim serve"} <= set(seen["-B"])


@pytest.mark.parametrize(
    ("args", "old", "new", "error"),
    [
        (["run", "--probe-decode", "0"], "--probe-decode", "--decode-batch-size",
         "pdexporter: error: --decode-batch-size 0: must be >= 1"),
        (["run", "--prefill-tokens=0"], "--prefill-tokens", "--new-prefill-tokens",
         "pdexporter: error: --new-prefill-tokens 0: must be >= 1"),
        (["thresholds", "--for-decodes", "0"], "--for-decodes", "--decode-batch-size",
         "pdexporter: error: --decode-batch-size 0: must be >= 1"),
    ],
)
def test_old_names_still_work_with_one_warning_line(args: list[str], old: str, new: str, error: str,
                                                  pdx_here: PdxHere) -> None:
    result = pdx_here(*args)
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2, result.stderr
    assert lines[0] == f"pdexporter: warning: {old} is now {new}; the old name goes in the next release"
    assert lines[1].startswith(error), result.stderr  # the value reached the new option
    assert len(lines) == 2


def test_old_names_are_hidden_from_help_and_measure_the_same(pdx_here: PdxHere) -> None:
    helps = {path: pdx_here(*path.split(), "--help").stdout for path in ("run", "thresholds")}
    for text in helps.values():
        assert not any(old in text for old in DEPRECATED), text
    # `sim serve` stands in for `vllm serve`: vLLM's own name stays, beside --chunk-size and -B
    serve = pdx_here("sim", "serve", "--help").stdout
    assert "--chunk-size" in serve and "--max-num-batched-tokens" in serve and "-B" in serve


def test_an_old_name_runs_the_exporter_like_the_new_one(tmp_path: Path) -> None:
    """`run --probe-decode 2 --prefill-tokens 1024` (the README's old names) still measures windows."""
    out = tmp_path / "results"
    result = _pdx("run", "--probe-decode", "2", "--prefill-tokens", "1024", "-B", "2048", "--inject-every", "500ms",
                  "--decode-output-tokens", "96", "--duration", "8s", "--listen", "127.0.0.1:0", "--out", str(out),
                  timeout=180)
    assert result.returncode == 0, result.stderr
    assert result.stderr.count("pdexporter: warning:") == 2
    assert "2 probe streams" in result.stderr and "a 1024-token prefill every 0.5 s" in result.stderr
    records = list(ResultsStore(out).iter_records())
    assert records and {r.key for r in records} == {(2048, 2, 1024)}


# --- help texts -------------------------------------------------------------------------------


@pytest.mark.parametrize("path", sorted(COMMANDS), ids=lambda p: p.replace(" ", "-"))
def test_help_shows_no_bool_and_positionals_in_capitals(path: str, pdx_here: PdxHere) -> None:
    result = pdx_here(*path.split(), "--help")
    assert result.returncode == 0, result.stderr
    text = result.stdout
    assert "<bool>" not in text, text
    usage = next(line for line in text.splitlines() if "Usage:" in line)
    assert not re.search(r"[{}]", usage), usage  # typer's own rendering is {sweep_file}
    for param in COMMANDS[path].params:  # type: ignore[attr-defined]
        if param.param_type_name == "argument":
            assert param.name.upper() in usage, usage


def test_every_duration_option_takes_the_one_syntax_and_says_so(pdx_here: PdxHere) -> None:
    """Options that take a time span: their help shows <duration> and the syntax; the ones named
    for their unit (--transfer-ms, --tpot-slo-ms) say that unit instead."""
    durations = {"run": ["--inject-every", "--duration", "--scrape-interval", "--attribution-wait"],
                 "sweep": ["--deadline", "--cooldown"], "load": ["--duration"], "export-table": ["--step"],
                 "dashboards push": ["--timeout"]}
    for path, flags in durations.items():
        text = " ".join(pdx_here(*path.split(), "--help").stdout.split())
        for flag in flags:
            assert re.search(rf"{flag} <duration> .*?500ms, 30s, 1h30m or seconds", text), (path, flag, text)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["sweep", "sweeps/quick.yaml", "--deadline", "1x"], "pdexporter: error: --deadline '1x': expected a duration"),
        (["sweep", "sweeps/quick.yaml", "--deadline", "0s"], "pdexporter: error: --deadline '0s': must be > 0"),
        (["sweep", "sweeps/quick.yaml", "--cooldown", "5 minutes"], "pdexporter: error: --cooldown '5 minutes': "),
        (["dashboards", "push", "--grafana-url", "http://127.0.0.1:9", "--timeout", "1e3"],
         "pdexporter: error: --timeout '1e3': expected a duration"),
        (["load", "--target", "http://127.0.0.1:9", "--duration", "soon"], "pdexporter: error: --duration 'soon': "),
    ],
)
def test_bad_durations_are_one_line_naming_the_flag(args: list[str], message: str, pdx_here: PdxHere) -> None:
    result = pdx_here(*args)
    assert result.returncode == 2, result.stderr
    assert result.stderr.strip().startswith(message) and len(result.stderr.strip().splitlines()) == 1, result.stderr


def test_deadline_and_cooldown_take_units(tmp_path: Path, pdx_here: PdxHere) -> None:
    out = tmp_path / "r"
    result = pdx_here("sweep", "sweeps/quick.yaml", "--out", str(out), "--cooldown", "250ms", "--deadline", "1h30m")
    assert result.returncode == 0, result.stderr
    doc = json.loads((out / "sweep.json").read_text())
    assert doc["spec"]["cooldown"]["seconds"] == 0.25


# --- errors blamed on the right thing ---------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (
            ["sweep", "sweeps/quick.yaml", "--mode", "turbo"],
            "pdexporter: error: --mode 'turbo': must be one of 'faithful' or 'fast'",
        ),
        (
            ["sim", "sweep", "sweeps/quick.yaml", "--mode", "turbo"],
            "pdexporter: error: --mode 'turbo': must be one of 'faithful' or 'fast'",
        ),
        (
            ["sweep", "sweeps/quick.yaml", "--clock", "wall"],
            "pdexporter: error: --clock 'wall': must be one of 'virtual' or 'real'",
        ),
        (
            ["sweep", "sweeps/quick.yaml", "--listen", "nowhere"],
            "pdexporter: error: --listen 'nowhere': expected HOST:PORT",
        ),
        (
            ["sweep", "sweeps/quick.yaml", "--target", "vllm:8000", "-B", "2048"],
            "pdexporter: error: --target 'vllm:8000': must be an http:// or https:// URL",
        ),
        (
            ["sweep", "sweeps/quick.yaml", "--target", "http://127.0.0.1:9"],
            "pdexporter: error: --target http://127.0.0.1:9: sweeps/quick.yaml has chunk sizes 2048, 8192 "
            "and an engine already running has one; pass --chunk-size B",
        ),
        (
            ["sweep", "sweeps/quick.yaml", "--target", "http://127.0.0.1:9", "--chunk-size", "4096"],
            "pdexporter: error: --chunk-size 4096: not in sweeps/quick.yaml's grid.chunk_sizes (2048, 8192)",
        ),
        (["sweep", "sweeps/quick.yaml", "-B", "2048"], "pdexporter: error: --chunk-size 2048: only with --target"),
        (
            ["sweep", "sweeps/h200.yaml", "--clock", "real"],
            "pdexporter: error: --clock 'real': the file's launcher has no clock",
        ),
    ],
)
def test_a_flag_error_names_the_flag_not_the_file(args: list[str], expected: str, pdx_here: PdxHere) -> None:
    result = pdx_here(*args)
    assert result.returncode == 2, result.stderr
    line = result.stderr.strip()
    assert line.startswith(expected) and "\n" not in line, line
    assert "launcher.chunk_size" not in line and not line.startswith("pdexporter: error: sweeps/quick.yaml:")


@pytest.fixture
def sim_engine_2048(tmp_path: Path) -> Iterator[str]:
    """A real `pdexporter sim serve` at chunk size 2048, over HTTP."""
    port = free_port()
    log = (tmp_path / "serve.log").open("w")
    proc = subprocess.Popen([sys.executable, "-m", "pdexporter", "sim", "serve", "-B", "2048", "--port", str(port)],
                            cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, env=ENV)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while "serving" not in (tmp_path / "serve.log").read_text():
            assert proc.poll() is None and time.monotonic() < deadline, (tmp_path / "serve.log").read_text()
            time.sleep(0.2)
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        log.close()


def test_target_with_chunk_size_runs_the_grid_at_that_chunk_size(sim_engine_2048: str, tmp_path: Path) -> None:
    """A grid of two chunk sizes against one running engine: --chunk-size picks the one it runs."""
    sweep = tmp_path / "two.yaml"
    # What is checked is which chunk size runs, not the measurement: a real-time engine starved beside
    # a CPU burner can miss the steady state (8 intervals within 2x) in 3 attempts, so it has more.
    sweep.write_text(yaml.safe_dump({"name": "two", "grid": {"chunk_sizes": [2048, 8192], "decode_batch_sizes": [2],
                                     "new_prefill_tokens": [1024]}, "reps": 1, "mode": "fast", "retries": 8}))
    out = tmp_path / "out"
    result = _pdx("sweep", str(sweep), "--target", sim_engine_2048, "-B", "2048", "--out", str(out))
    assert result.returncode == 0, result.stderr
    records = list(ResultsStore(out).iter_records())
    assert [r.key for r in records] == [(2048, 2, 1024)]
    assert records[0].config.engine_url == sim_engine_2048


def test_a_misspelt_sweep_key_is_named_with_the_key_it_meant(tmp_path: Path) -> None:
    bad = tmp_path / "typo.yaml"
    bad.write_text("grid:\n  chunk_sizes: [8192]\n  decode_batch_size: [0, 4]\n  new_prefill_tokens: [512]\n")
    result = _pdx("sweep", str(bad))
    assert result.returncode == 2
    assert result.stderr.strip() == (f"pdexporter: error: {bad}: grid.decode_batch_size: unknown field "
                                     "(did you mean decode_batch_sizes?)")


def test_a_misspelt_profile_key_is_named_with_the_key_it_meant(tmp_path: Path, pdx_here: PdxHere) -> None:
    text = (ROOT / "pdexporter" / "sim" / "profiles" / "h200-qwen3-coder-30b-a3b.yaml").read_text()
    profile = tmp_path / "typo.yaml"
    profile.write_text(text.replace("\n  num_layers:", "\n  num_layer:", 1))
    result = pdx_here("run", "--profile", str(profile), "--listen", "127.0.0.1:0")
    assert result.returncode == 2
    assert result.stderr.strip() == (f"pdexporter: error: {profile}: model.num_layer: unknown field "
                                     "(did you mean num_layers?)")


def test_a_misspelt_record_key_is_named_beside_the_missing_one(tmp_path: Path, pdx_here: PdxHere) -> None:
    """Records allow unknown keys (newer versions add some), so the misspelt one is named where
    the field it meant is reported missing."""
    source = next((ROOT / "results" / "h200-vllm0.22-qwen3-coder-30b-a3b").glob("8192/D*_P*.json"))
    doc = json.loads(source.read_text())
    doc["config"]["decode_batch_sizes"] = doc["config"].pop("decode_batch_size")
    (tmp_path / "8192").mkdir()
    path = tmp_path / "8192" / source.name
    path.write_text(json.dumps(doc))
    result = pdx_here("export-table", str(tmp_path), "--no-plots")
    assert result.returncode != 0
    assert result.stderr.strip().endswith(f"{path}: config.decode_batch_size: required field is missing; found "
                                          "decode_batch_sizes (a typo?)"), result.stderr
