"""One-line errors that named the wrong thing (the bad-input audit of session 22): each names the
option or path that is wrong, and why."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.helpers import run_cli
from tests.integration.faults.faultkit import error_line

pytestmark = pytest.mark.integration


@pytest.mark.parametrize("value", ["nan", "inf", "-inf"])
def test_a_number_that_is_not_finite_says_so(value: str, capsys) -> None:
    code, out, err = run_cli(capsys, "decide", "-D", "1", "-P", "8192", "--transfer-ms", value)
    assert code == 2, (out, err)
    assert error_line(err) == (f"pdexporter: error: --transfer-ms {value}: not a finite number "
                               "(see pdexporter decide --help)")


def test_an_unknown_reference_profile_names_from(capsys) -> None:
    code, out, err = run_cli(capsys, "sim", "profile-from-config", "qwen3-14b", "--gpu", "H200", "--from", "nosuch")
    assert code == 2, (out, err)
    assert error_line(err).startswith("pdexporter: error: --from 'nosuch': unknown profile; shipped: ")


def test_a_file_given_as_results_directory_is_named(tmp_path: Path, capsys) -> None:
    script = tmp_path / "p.sh"
    script.write_text("echo\n")
    code, out, err = run_cli(capsys, "export-table", str(script))
    assert code == 2, (out, err)
    assert error_line(err) == f"pdexporter: error: {script}: not a results directory (a file)"


def test_load_without_a_target_says_it_is_required(capsys) -> None:
    code, out, err = run_cli(capsys, "load", "--rate", "1", "--duration", "1s")
    assert code == 2, (out, err)
    assert error_line(err) == "pdexporter: error: --target: required (the engine's http:// or https:// URL)"


def _a_committed_record(tmp_path: Path) -> tuple[Path, Path, dict]:
    """A committed H200 record copied into a results directory of its own: (results, its path, its JSON)."""
    import shutil

    source = Path(__file__).resolve().parents[3] / "results" / "h200-vllm0.22-qwen3-14b"
    chunk = next(p for p in sorted(source.iterdir()) if p.name.isdigit())
    record = next(p for p in sorted(chunk.glob("D1_P*.json")))
    results = tmp_path / "results"
    (results / chunk.name).mkdir(parents=True)
    target = results / chunk.name / record.name
    shutil.copy(record, target)
    return results, target, json.loads(target.read_text())


@pytest.mark.parametrize(("change", "why"), [
    ({"decode_batch_size": 7}, "config.decode_batch_size is 7, but the file's place says 1"),
    ({"reps": []}, "reps: empty (a record holds the repetitions it was made of)"),
])
def test_a_record_that_contradicts_its_place_is_one_line(tmp_path: Path, capsys, change: dict, why: str) -> None:
    """The audit: a D1_P512.json whose config said D = 7 was tabulated as D = 7, one with no repetitions as one."""
    results, target, data = _a_committed_record(tmp_path)
    for key, value in change.items():
        (data if key == "reps" else data["config"])[key] = value
    target.write_text(json.dumps(data))
    code, out, err = run_cli(capsys, "export-table", str(results), "--out", str(tmp_path / "out"))
    assert code == 2, (out, err)
    assert error_line(err) == f"pdexporter: error: {target}: {why}"


@pytest.mark.parametrize(("block", "field"), [("interference", "prefill_duration_ms"), ("baseline", "tpot_p50_ms"),
                                              ("interference", "num_chunks_actual")])
def test_a_negative_duration_or_count_in_a_record_is_refused_naming_it(tmp_path: Path, capsys, block: str,
                                                                       field: str) -> None:
    """The audit: a repetition whose prefill took -5 ms was tabulated. Only the declared differences
    (`Quantity.signed`: a penalty, the interference) may be negative."""
    results, target, data = _a_committed_record(tmp_path)
    data["reps"][0][block][field] = -5
    data["reps"][0]["derived"]["tpot_penalty_ms"] = -0.4  # a penalty inside the noise stays allowed
    target.write_text(json.dumps(data))
    code, out, err = run_cli(capsys, "export-table", str(results), "--out", str(tmp_path / "out"))
    assert code == 2, (out, err)
    line = error_line(err)
    assert str(target) in line and f"{block}.{field}" in line and "-5" in line and ">= 0" in line, line
