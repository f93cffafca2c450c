"""`pdexporter reanalyse DIR` on a damaged raw timestamps file: one line naming the file and the field,
exit 2, and the directory left as it was. A raw file with `"probes": []` gave its repetition null
numbers that were written over the measured ones ("1 changed; 1 record files rewritten"); a stream's
`dt_ns` of "abc" was a TypeError, a raw file whose top level is a list an AttributeError."""

from __future__ import annotations

import gzip
import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from pdexporter._internal.vloop import run_virtual
from pdexporter.measure.point import PointSpec, measure_point
from pdexporter.measure.protocol import ProtocolSettings, warm_prefix
from pdexporter.measure.sim_driver import SimDriver
from pdexporter.measure.store import ResultsStore
from tests.helpers import run_cli
from tests.integration.faults.faultkit import error_line

pytestmark = pytest.mark.integration

SETTINGS = ProtocolSettings()
B = 8192


@pytest.fixture(scope="module")
def measured(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two records measured on the simulated engine: D=2 (two repetitions) and D=1 (one)."""
    root = tmp_path_factory.mktemp("measured")

    async def main() -> None:
        async with SimDriver.create(chunk_size=B) as driver:
            await warm_prefix(driver, SETTINGS)
            for d, reps in ((1, 1), (2, 2)):
                await measure_point(driver, PointSpec(B, d, 4096), SETTINGS, ResultsStore(root), reps=reps)

    run_virtual(main())
    return root


@pytest.fixture
def results(measured: Path, tmp_path: Path) -> Path:
    out = tmp_path / "results"
    shutil.copytree(measured, out)
    return out


def _edit_raw(path: Path, edit: Callable[[Any], Any]) -> None:
    raw = json.loads(gzip.decompress(path.read_bytes()))
    path.write_bytes(gzip.compress(json.dumps(edit(raw)).encode()))


def _rep_raw(results: Path, d: int, rep: int) -> Path:
    record = json.loads((results / str(B) / f"D{d}_P4096.json").read_text())
    return results / str(B) / record["reps"][rep]["raw"]


def _set(key: str, value: Any, stream: str = "probes") -> Callable[[Any], Any]:
    def edit(raw: Any) -> Any:
        target = raw["probes"][0] if stream == "probes" else raw[stream]
        target[key] = value
        return raw
    return edit


def _first_dt(value: Any) -> Callable[[Any], Any]:
    def edit(raw: Any) -> Any:
        raw["probes"][0]["dt_ns"][0] = value
        return raw
    return edit


def _snapshot(results: Path) -> dict[str, bytes]:
    return {str(p.relative_to(results)): p.read_bytes() for p in sorted(results.rglob("*.json"))}


def _reanalyse(capsys, results: Path) -> str:
    code, out, err = run_cli(capsys, "reanalyse", str(results))
    assert code == 2, (out, err)
    return error_line(err)


def test_a_raw_file_with_no_probes_is_refused_and_nothing_is_rewritten(results: Path, capsys) -> None:
    # a stale number in the record reanalyse reads first: a run that went on would rewrite it
    first = results / str(B) / "D1_P4096.json"
    record = json.loads(first.read_text())
    record["reps"][0]["derived"]["tpot_penalty_p50_ms"] = -1.0
    first.write_text(json.dumps(record))
    raw = _rep_raw(results, 2, 1)
    _edit_raw(raw, lambda r: {**r, "probes": []})
    before = _snapshot(results)
    line = _reanalyse(capsys, results)
    assert line == (f"pdexporter: error: {raw}: probes: empty, but repetition 1 ran D=2 decodes: the raw file is "
                    "damaged and cannot re-derive it (no record was rewritten)")
    assert _snapshot(results) == before  # the measured numbers are kept, the stale one too


def test_a_phase1_file_with_no_probes_is_refused(results: Path, capsys) -> None:
    raw = ResultsStore(results).baseline_raw_path(B, 2)
    _edit_raw(raw, lambda r: {**r, "probes": []})
    before = _snapshot(results)
    line = _reanalyse(capsys, results)
    assert line == (f"pdexporter: error: {raw}: probes: empty, but Phase 1 ran D=2 decodes: the raw file is damaged "
                    "and cannot re-derive it (no record was rewritten)")
    assert _snapshot(results) == before


@pytest.mark.parametrize(("edit", "what"), [
    (_set("dt_ns", "abc"), "probes[0].dt_ns: must be a list of integers (got 'abc')"),
    (_set("dt_ns", [None]), "probes[0].dt_ns[0]: must be an integer (got None)"),
    (_first_dt("abc"), "probes[0].dt_ns[0]: must be an integer (got 'abc')"),
    (_set("n", [1]), "probes[0].n: 1 item(s), one per dt_ns ("),
    (_set("sent_ns", "0", stream="prefill"), "prefill.sent_ns: must be an integer or null (got '0')"),
    (lambda raw: [raw], "not raw timestamps (a JSON object at the top; got a list)"),
    (lambda raw: {k: v for k, v in raw.items() if k != "t_first_ns"}, "t_first_ns: required field is missing"),
], ids=["dt-not-a-list", "dt-null", "dt-abc", "counts-differ", "sent-a-string", "top-level-list", "no-t-first"])
def test_a_malformed_raw_file_is_one_line_naming_the_file_and_field(
        edit: Callable[[Any], Any], what: str, results: Path, capsys) -> None:
    raw = _rep_raw(results, 2, 0)
    _edit_raw(raw, edit)
    before = _snapshot(results)
    line = _reanalyse(capsys, results)
    assert line.startswith(f"pdexporter: error: {raw}: {what}"), line
    assert line.endswith("(no record was rewritten)"), line
    assert _snapshot(results) == before


def test_an_intact_directory_still_reanalyses(results: Path, capsys) -> None:
    code, out, err = run_cli(capsys, "reanalyse", str(results))
    assert code == 0, err
    assert "2 records, 3 repetitions: 0 changed" in " ".join((out + err).split())
