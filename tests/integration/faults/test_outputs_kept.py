"""A command's output never replaces a file of another kind (the bad-input audit: `report --out
RESULTS/6144/D1_P512.json` wrote HTML over a record, `sim profile-from-config --out` YAML over one),
and an option naming a directory that is not there is one line, not ignored."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers import run_cli
from tests.integration.faults.faultkit import error_line

pytestmark = pytest.mark.integration

RESULTS = Path(__file__).resolve().parents[3] / "results" / "h200-vllm0.22-qwen3-14b"


def test_report_does_not_write_over_a_record(tmp_path: Path, capsys) -> None:
    record = tmp_path / "D1_P512.json"
    record.write_text('{"config": {}}')
    code, out, err = run_cli(capsys, "report", str(RESULTS), "--out", str(record))
    assert code == 2, (out, err)
    assert error_line(err) == (f"pdexporter: error: --out {record}: an existing .json file, and this writes .html: "
                               "give a new path (nothing was overwritten)")
    assert record.read_text() == '{"config": {}}'


def test_profile_from_config_does_not_write_over_a_record(tmp_path: Path, capsys) -> None:
    record = tmp_path / "D1_P512.json"
    record.write_text('{"config": {}}')
    code, out, err = run_cli(capsys, "sim", "profile-from-config", "qwen3-14b", "--gpu", "H200", "--out", str(record))
    assert code == 2, (out, err)
    assert "an existing .json file, and this writes .yaml" in error_line(err)
    assert record.read_text() == '{"config": {}}'


def test_report_with_an_injected_directory_that_is_not_there_is_one_line(tmp_path: Path, capsys) -> None:
    code, out, err = run_cli(capsys, "report", str(RESULTS), "--injected", str(tmp_path / "nope"),
                             "--out", str(tmp_path / "r.html"))
    assert code == 2, (out, err)
    assert error_line(err) == (f"pdexporter: error: --injected {tmp_path / 'nope'}: not a results directory (the "
                               "injected records of the same engine)")
    assert not (tmp_path / "r.html").exists()
