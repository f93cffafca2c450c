"""Results on disk: layout, atomic writes, validation errors that name file and field."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pdexporter._internal.atomic import atomic_write_json, atomic_write_json_gz, read_json_gz
from pdexporter.errors import RecordError
from pdexporter.measure.records import aggregate
from pdexporter.measure.store import ResultsStore, load_record_file
from tests.unit.measure.test_records import CONFIG, _rep


def test_layout_matches_the_seed(tmp_path: Path) -> None:
    store = ResultsStore(tmp_path / "results")
    assert store.record_path(8192, 4, 8192) == tmp_path / "results" / "8192" / "D4_P8192.json"
    assert store.raw_path(2048, 0, 512, 3).name == "D0_P512_r3.json.gz"
    assert store.relative(2048, store.raw_path(2048, 0, 512, 3)) == "raw/D0_P512_r3.json.gz"


def test_save_and_load_round_trip(tmp_path: Path) -> None:
    store = ResultsStore(tmp_path)
    record = aggregate(CONFIG, [_rep(0, 46.9, 91.0, [8188, 4])])
    path = store.save_record(record)
    assert store.load_record(8192, 4, 8192) == load_record_file(path)
    assert [p.name for p in store.iter_record_paths()] == ["D4_P8192.json"]
    assert len(list(store.iter_records())) == 1
    assert store.load_record(8192, 4, 1) is None


def test_atomic_write_leaves_old_file_when_serialisation_fails(tmp_path: Path) -> None:
    target = tmp_path / "r.json"
    atomic_write_json(target, {"ok": 1})
    with pytest.raises(ValueError):
        atomic_write_json(target, {"bad": float("nan")})
    assert json.loads(target.read_text()) == {"ok": 1}
    assert [p.name for p in tmp_path.iterdir()] == ["r.json"]  # no temp file left behind


def test_gzip_json_round_trip_is_reproducible(tmp_path: Path) -> None:
    a, b = tmp_path / "a.json.gz", tmp_path / "b.json.gz"
    payload = {"dt_ns": list(range(1000))}
    atomic_write_json_gz(a, payload)
    atomic_write_json_gz(b, payload)
    assert a.read_bytes() == b.read_bytes()
    assert read_json_gz(a) == payload


@pytest.mark.parametrize(
    "content, fragment",
    [
        ("{not json", "not valid JSON"),
        (json.dumps({"config": {}}), "config.decode_batch_size: required field is missing"),
        (json.dumps({"config": {"decode_batch_size": -1}}), "config.decode_batch_size: must be >= 0 (got -1)"),
    ],
)
def test_bad_records_name_file_and_field(tmp_path: Path, content: str, fragment: str) -> None:
    path = tmp_path / "8192" / "D4_P8192.json"
    path.parent.mkdir()
    path.write_text(content)
    with pytest.raises(RecordError) as excinfo:
        load_record_file(path)
    message = str(excinfo.value)
    assert str(path) in message and fragment in message and "\n" not in message


def test_unreadable_record_is_a_record_error(tmp_path: Path) -> None:
    path = tmp_path / "D1_P1.json"
    path.mkdir()  # a directory where a record should be: unreadable even for root
    with pytest.raises(RecordError, match="cannot read"):
        load_record_file(path)


def test_results_are_group_readable_and_engine_logs_private(tmp_path: Path) -> None:
    """Issue 24: results were 0644 (readable by every user of the machine), and so were engine logs,
    in which vLLM prints its arguments, an API key among them. Results: 0640 (a team shares them
    through the group); engine logs: 0600, an old one made so too."""
    import os

    from pdexporter._internal.atomic import open_private_log

    target = atomic_write_json(tmp_path / "r.json", {"ok": 1})
    mask = os.umask(0)
    os.umask(mask)
    assert target.stat().st_mode & 0o777 == 0o640 & ~mask
    old = tmp_path / "engine" / "engine.log"
    old.parent.mkdir()
    old.write_text("an earlier engine's log\n")
    old.chmod(0o644)
    with open_private_log(old) as log:
        log.write(b"more\n")
    with open_private_log(tmp_path / "new" / "sim.log") as log:
        log.write(b"x")
    assert old.stat().st_mode & 0o777 == 0o600 and (tmp_path / "new" / "sim.log").stat().st_mode & 0o777 == 0o600
    assert old.read_text() == "an earlier engine's log\nmore\n"


def test_a_record_from_a_later_schema_is_refused_in_one_line(tmp_path: Path) -> None:
    """Issue 24: a record written by a newer pdexporter was read silently, and the next repetition
    rewrote it without the keys this one does not know."""
    from pdexporter import __version__
    from pdexporter.measure.records import RECORD_SCHEMA

    store = ResultsStore(tmp_path)
    path = store.save_record(aggregate(CONFIG, [_rep(0, 46.9, 91.0, [8188, 4])]))
    data = json.loads(path.read_text())
    assert data["schema_version"] == RECORD_SCHEMA
    data.update(schema_version=RECORD_SCHEMA + 1, future_block={"x": 1})
    data["provenance"]["pdexporter_version"] = "9.0.0"
    path.write_text(json.dumps(data))
    with pytest.raises(RecordError) as info:
        load_record_file(path)
    assert str(info.value) == (f"{path}: written by pdexporter 9.0.0 with record schema {RECORD_SCHEMA + 1}; "
                               f"pdexporter {__version__} reads schema {RECORD_SCHEMA} and older: upgrade pdexporter "
                               "to read or extend it")
    data.pop("schema_version")  # records written before the field: schema 1, read as ever
    data.pop("future_block")
    path.write_text(json.dumps(data))
    assert load_record_file(path).schema_version == 1


def test_a_directory_keeps_the_window_settings_it_was_measured_with(tmp_path: Path) -> None:
    """`window.json` (measure and run): written once, the same settings again are fine, other ones are
    refused in one line naming the file, the field and both values; a broken file is one line too."""
    store = ResultsStore(tmp_path)
    assert store.load_window() is None
    path = store.save_window({"warmup_tokens": 16, "after_intervals": 32, "slow_rel": 0.2, "slow_mad_k": 5.0})
    assert store.save_window({"after_intervals": 32}) == path
    assert store.load_window() == {"warmup_tokens": 16, "after_intervals": 32, "slow_rel": 0.2, "slow_mad_k": 5.0}
    with pytest.raises(RecordError) as info:
        store.save_window({"after_intervals": 8})
    assert str(info.value).startswith(f"{path}: window.after_intervals is 32 there, this run's is 8")
    for broken in ('{"window": [1, 2]}', '{"window": {"after_intervals": true}}', "{", '{"window": {"x": NaN}}'):
        path.write_text(broken)
        with pytest.raises(RecordError, match=f"^{path}: ") as info:
            store.load_window()
        assert "\n" not in str(info.value)
