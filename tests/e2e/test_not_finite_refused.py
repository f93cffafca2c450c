"""Numbers pdexporter never writes are refused in one line, naming the file and the field or line
(issue 31): NaN, Infinity and 1e999 in a record (export-table, report, compare, decide and a
sweep's resume gave 58-78-line tracebacks, or a table silently built on them), NaN coefficients in
a decision.json (a "decided" verdict), a 5000-digit P, `.nan` or a key given twice in a sweep
file (a traceback; the last key silently kept), and a placeholder nobody defines in the launcher's
command (reported only after `sweep.json` was written). The commands run in this process
(`cli.main`); the records are synthetic (`analysis.synthetic`)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pdexporter._internal.finite import NotFinite, load_yaml_strict, loads_finite
from pdexporter.analysis.synthetic import SyntheticTruth, seed_grid, synthetic_records
from pdexporter.measure.store import ResultsStore
from tests.helpers import run_cli

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
DECISION = ROOT / "results" / "h200-vllm0.22-qwen3-coder-30b-a3b" / "decision.json"


def _cli(capsys, *argv: str) -> tuple[int, str]:  # type: ignore[no-untyped-def]
    code, out, err = run_cli(capsys, *argv)
    return code, out + err



def _one_line(text: str) -> str:
    lines = [line for line in text.splitlines() if line.startswith("pdexporter: error:")]
    assert len(lines) == 1 and "Traceback" not in text, text[-3000:]
    return lines[0]


def _results(root: Path, bad: str) -> Path:
    """Four synthetic records at B=2048, the first with `bad` (a JSON number's text) as its
    baseline TPOT."""
    store = ResultsStore(root)
    grid = list(seed_grid(chunks=(2048,), decodes=(1, 4), prefills=(512, 4096)))
    paths = [store.save_record(record) for record in synthetic_records(SyntheticTruth(), grid, reps=2)]
    text = paths[0].read_text()
    old = json.dumps(json.loads(text)["baseline"]["tpot_p50_ms"])
    assert f'"tpot_p50_ms": {old}' in text
    paths[0].write_text(text.replace(f'"tpot_p50_ms": {old}', f'"tpot_p50_ms": {bad}', 1))
    return paths[0]


@pytest.mark.parametrize("bad", ["NaN", "Infinity", "-1e999", "9" * 5000])
@pytest.mark.parametrize("command", ["export-table", "report", "compare", "decide"])
def test_a_record_holding_a_number_that_is_not_one_is_one_line(
        command: str, bad: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _results(tmp_path / "res", bad)
    argv = {
        "export-table": ["export-table", str(tmp_path / "res"), "--out", str(tmp_path / "out")],
        "report": ["report", str(tmp_path / "res"), "--out", str(tmp_path / "out")],
        "compare": ["compare", str(tmp_path / "res"), str(tmp_path / "res"), "--out", str(tmp_path / "out")],
        "decide": ["decide", "-D", "4", "-P", "4096", "-B", "2048", "--results", str(tmp_path / "res")],
    }[command]
    code, text = _cli(capsys, *argv)
    line = _one_line(text)
    assert code == 2 and f"{path}: baseline.tpot_p50_ms: " in line, line
    assert ("not a finite number" if bad in ("NaN", "Infinity") else "too large a number") in line


def test_a_decision_with_nan_coefficients_is_refused_naming_the_field(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    doc = json.loads(DECISION.read_text())
    doc["model"]["coefficients"]["alpha0_ms"] = float("nan")
    path = tmp_path / "decision.json"
    path.write_text(json.dumps(doc))  # json writes NaN as is
    for argv in (["decide", "-D", "4", "-P", "16384", "-B", "2048", "--model", str(path)],
                 ["thresholds", "--model", str(path), "--out", str(tmp_path / "thr")]):
        code, text = _cli(capsys, *argv)
        line = _one_line(text)
        assert code == 2 and "model.coefficients.alpha0_ms: NaN: not a finite number" in line, line
        assert "OFFLOAD" not in text and "KEEP LOCAL" not in text


def test_a_sweep_resumed_on_a_record_holding_nan_is_one_line(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _results(tmp_path / "res", "NaN")
    spec = tmp_path / "sweep.yaml"
    spec.write_text("grid: {chunk_sizes: [2048], decode_batch_sizes: [1, 4], new_prefill_tokens: [512, 4096]}\n"
                    f"reps: 2\noutput: {tmp_path / 'res'}\n")
    code, text = _cli(capsys, "sweep", str(spec))
    assert code == 2 and f"{path}: baseline.tpot_p50_ms: NaN" in _one_line(text)


def _sweep_file(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "sweep.yaml"
    path.write_text(f"grid: {{chunk_sizes: [2048], decode_batch_sizes: [1], new_prefill_tokens: [64]}}\n"
                    f"output: {tmp_path / 'out'}\n{text}")
    return path


@pytest.mark.parametrize(("text", "message"), [
    ("reps: 1\nreps: 3\n", "line 4: key 'reps' given twice (first at line 3)"),
    (f"reps: {'9' * 5000}\n", "line 3: a number of 5000 digits: too large"),
    ("cooldown: {seconds: .nan}\n", "line 3: .nan: not a finite number"),
    ('launcher: {kind: local, command: "{python} -m x --port {prot} --b {chunk}"}\n',
     "launcher.command: unknown placeholder {prot}; define it under launcher.vars"),
    ('launcher: {kind: local, command: "x --b {chunk} {"}\n', "launcher.command: bad template"),
])
def test_a_bad_sweep_file_is_one_line_before_anything_is_written(
        text: str, message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _sweep_file(tmp_path, text)
    code, out = _cli(capsys, "sweep", str(path))
    line = _one_line(out)
    assert code == 2 and line.startswith(f"pdexporter: error: {path}: ") and message in line, line
    assert not (tmp_path / "out").exists()  # no sweep.json, nothing


def test_loaders_name_where_the_number_is() -> None:
    with pytest.raises(NotFinite, match=r"^a\[1\]\.b: NaN: not a finite number$"):
        loads_finite('{"a": [1, {"b": NaN}]}')
    assert loads_finite('{"t": 1700000000000000000, "x": 1.5e300}') == {"t": 1700000000000000000, "x": 1.5e300}
    assert load_yaml_strict("a: {b: 1, c: [1, 2.5]}\n") == {"a": {"b": 1, "c": [1, 2.5]}}
    with pytest.raises(ValueError, match=r"line 3: key 'b' given twice \(first at line 2\)"):
        load_yaml_strict("a:\n  b: 1\n  b: 2\n")
