"""`pdexporter validate --colocated A --colocated B` on a bad campaign.yaml: one line naming the file,
exit 2. A campaign.yaml that is not UTF-8 was a UnicodeDecodeError traceback; `date: not-a-date` was
taken as the campaign's date."""

from __future__ import annotations

from pathlib import Path

import pytest

from pdexporter.analysis.campaigns import CAMPAIGN_FILE, load_campaign
from pdexporter.errors import RecordError
from tests.helpers import run_cli
from tests.integration.faults.faultkit import error_line

pytestmark = pytest.mark.integration


def _campaigns(tmp_path: Path, second: bytes) -> tuple[Path, Path]:
    a, b = tmp_path / "a", tmp_path / "b"
    for d in (a, b):
        d.mkdir()
    (a / CAMPAIGN_FILE).write_text("id: a\ndate: 2026-12-03\nrole: fit\n")
    (b / CAMPAIGN_FILE).write_bytes(second)
    return a, b


def _validate(capsys, a: Path, b: Path, tmp_path: Path) -> str:
    code, out, err = run_cli(capsys, "validate", "--colocated", str(a), "--colocated", str(b),
                             "--out", str(tmp_path / "out"))
    assert code == 2, (out, err)
    return error_line(err)


def test_a_campaign_file_that_is_not_utf8_is_one_line(tmp_path: Path, capsys) -> None:
    a, b = _campaigns(tmp_path, b"id: b\ndate: 2026-12-03\nrole: fit\nnote: caf\xe9\n")
    line = _validate(capsys, a, b, tmp_path)
    assert line == (f"pdexporter: error: {b / CAMPAIGN_FILE}: line 4: not UTF-8 text (byte 0xe9 at offset 42)")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("date", ["not-a-date", "'2026-02-30'", "'3 December'", "20261203"])
def test_a_campaign_date_that_is_not_a_date_is_one_line(date: str, tmp_path: Path, capsys) -> None:
    a, b = _campaigns(tmp_path, f"id: b\ndate: {date}\nrole: fit\n".encode())
    line = _validate(capsys, a, b, tmp_path)
    shown = repr(date.strip("'")) if not date.isdigit() else date
    assert line == f"pdexporter: error: {b / CAMPAIGN_FILE}: date: {shown} is not a date (YYYY-MM-DD)"


@pytest.mark.parametrize(("date", "kept"), [("2026-12-03", "2026-12-03"), ("'2026-12-03'", "2026-12-03"),
                                            ("2026-12-03 10:00:00", "2026-12-03 10:00:00")])
def test_a_campaign_date_is_read_as_before(date: str, kept: str, tmp_path: Path) -> None:
    (tmp_path / CAMPAIGN_FILE).write_text(f"id: c\ndate: {date}\nrole: fit\n")
    info = load_campaign(tmp_path)
    assert info is not None and info["date"] == kept


def test_load_campaign_refuses_a_bad_date(tmp_path: Path) -> None:
    (tmp_path / CAMPAIGN_FILE).write_text("id: c\ndate: not-a-date\nrole: fit\n")
    with pytest.raises(RecordError, match=r"campaign.yaml: date: 'not-a-date' is not a date \(YYYY-MM-DD\)$"):
        load_campaign(tmp_path)


def test_one_campaign_is_refused_before_an_empty_table_is_written(tmp_path: Path, capsys) -> None:
    """The bad-input audit: `validate` with one campaign (or two directories of one id) held nothing out
    and wrote an empty held_out.csv over the last one."""
    a, b = _campaigns(tmp_path, b"id: a\ndate: 2026-12-03\nrole: fit\n")  # two directories, one campaign
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "held_out.csv").write_text("kept\n")
    code, out, err = run_cli(capsys, "validate", "--colocated", str(a), "--colocated", str(b),
                             "--out", str(tmp_path / "out"))
    assert code == 2, (out, err)
    assert error_line(err) == ("pdexporter: error: one campaign among the inputs (a): leaving one out needs two or "
                               "more (directories of one campaign.yaml id are one campaign)")
    assert (tmp_path / "out" / "held_out.csv").read_text() == "kept\n"
