"""`decide` and `thresholds` on a malformed decision.json (`--model FILE`): one line naming the file and
the field, exit 2, never a traceback (an empty penalty list was an IndexError, a chunk-size key "abc" a
ValueError, a two-arm coefficient "x" a TypeError, an unknown feature a bare ValueError, a bootstrap
replicate without a coefficient a KeyError), and never an
answer from a document missing a required term (a deleted offloaded_loss was read as 0 ms: OFFLOAD)."""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import run_cli
from tests.integration.faults.faultkit import error_line

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[3]
SEED = json.loads((ROOT / "results" / "h200-vllm0.22-qwen3-coder-30b-a3b-decodebench" / "decision.json").read_text())
ARMS = json.loads((ROOT / "results" / "h200x2-arms" / "decision.json").read_text())
B = next(iter(SEED["model"]["penalty_per_chunk_ms"]))  # a seed_per_chunk document: its first chunk size
DS = SEED["model"]["penalty_per_chunk_ms"][B]["decode_batch_size"]

Edit = Callable[[dict[str, Any]], None]


def _table(d: dict[str, Any]) -> dict[str, Any]:
    return d["model"]["penalty_per_chunk_ms"]


def _rename(d: dict[str, Any]) -> None:
    _table(d)["abc"] = _table(d).pop(B)


def _shorten(d: dict[str, Any]) -> None:
    _table(d)[B]["penalty_ms"] = _table(d)[B]["penalty_ms"][:2]


def _unsorted(d: dict[str, Any]) -> None:
    ds = _table(d)[B]["decode_batch_size"]
    ds[2] = ds[1]  # the third D repeats the second


def _loss(d: dict[str, Any]) -> dict[str, Any]:
    return d["two_arm"]["terms"]["offloaded_loss"]


def _unknown_feature(d: dict[str, Any]) -> None:
    _loss(d)["features"].append("zzz")
    _loss(d)["coefficients"]["zzz"] = 1.0


def _no_transfer_numbers(d: dict[str, Any]) -> None:
    del d["two_arm"]["terms"]["transfer"]["gb_per_s"]


CASES: list[tuple[str, dict[str, Any], Edit, str]] = [
    ("empty-penalties", SEED, lambda d: _table(d)[B].update(penalty_ms=[]),
     f"model.penalty_per_chunk_ms.{B}.penalty_ms: must have at least 1 item"),
    ("chunk-size-key", SEED, _rename,
     "model.penalty_per_chunk_ms.abc: the key must be a chunk size, a positive integer (got 'abc')"),
    ("lengths-differ", SEED, _shorten,
     f"model.penalty_per_chunk_ms.{B}.penalty_ms: 2 item(s), one per decode_batch_size ({len(DS)} given)"),
    ("d-not-ascending", SEED, _unsorted,
     f"model.penalty_per_chunk_ms.{B}.decode_batch_size[2]: must be larger than the one before it "
     f"(got {DS[1]} after {DS[1]})"),
    ("no-table", SEED, lambda d: d["model"].pop("penalty_per_chunk_ms"),
     "model.penalty_per_chunk_ms: required for the seed_per_chunk model (one entry per chunk size)"),
    ("coefficient-x", ARMS, lambda d: _loss(d)["coefficients"].update(d="x"),
     "two_arm.terms.offloaded_loss.coefficients.d: must be a number (got 'x')"),
    ("unknown-feature", ARMS, _unknown_feature,
     "two_arm.terms.offloaded_loss.features[3]: unknown feature 'zzz' (expected one of: "),
    ("feature-without-coefficient", ARMS, lambda d: _loss(d)["coefficients"].pop("p"),
     "two_arm.terms.offloaded_loss.coefficients.p: required field is missing (features[2] names it)"),
    ("term-missing", ARMS, lambda d: d["two_arm"]["terms"].pop("offloaded_loss"),
     "two_arm.terms.offloaded_loss: required term is missing (re-run export-table)"),
    ("term-misspelt", ARMS, lambda d: d["two_arm"]["terms"].update(offloaded_los=d["two_arm"]["terms"].pop(
        "offloaded_loss")),
     "two_arm.terms.offloaded_loss: required term is missing; found offloaded_los (a typo?)"),
    ("transfer-bandwidth", ARMS, _no_transfer_numbers,
     "two_arm.terms.transfer.gb_per_s: required field is missing (a measured transfer)"),
    ("coefficient-null", ARMS, lambda d: d["model"]["coefficients"].update(gamma_ms_per_token=None),
     "model.coefficients.gamma_ms_per_token: must be a number (got null)"),
    # the bootstrap replicates behind every interval (a KeyError, an IndexError, a TypeError before)
    ("replicate-coefficient", ARMS, lambda d: d["replicates"]["model"][5].pop("gamma_ms_per_token"),
     "replicates.model[5].gamma_ms_per_token: required field is missing"),
    ("replicate-not-a-number", ARMS, lambda d: d["replicates"]["model"][3].update(alpha0_ms="x"),
     "replicates.model[3].alpha0_ms: must be a number (got 'x')"),
    ("replicates-two-arm-short", ARMS, lambda d: d["replicates"].update(two_arm=d["replicates"]["two_arm"][:10]),
     "replicates.two_arm: 10 item(s), one per replicates.model (200 given; re-run export-table)"),
    ("replicates-campaign-short", ARMS, lambda d: d["replicates"].update(campaign=d["replicates"]["campaign"][:3]),
     "replicates.campaign: 3 item(s), one per replicates.model (200 given; re-run export-table)"),
    ("replicate-arm-feature", ARMS, lambda d: d["replicates"]["two_arm"][7]["offloaded_loss"].pop("d"),
     "replicates.two_arm[7].offloaded_loss.d: required field is missing (two_arm.terms.offloaded_loss has the "
     "feature)"),
]


@pytest.mark.parametrize(("base", "edit", "fragment"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_a_malformed_decision_document_is_one_line_naming_the_field(
        base: dict[str, Any], edit: Edit, fragment: str, tmp_path: Path, capsys) -> None:
    doc = copy.deepcopy(base)
    edit(doc)
    path = tmp_path / "decision.json"
    path.write_text(json.dumps(doc))
    for command in (["decide", "-D", "4", "-P", "16384", "-B", B, "--model", str(path)],
                    ["thresholds", "--model", str(path), "--replicates", "0"]):
        code, out, err = run_cli(capsys, *command)
        assert code == 2, (command, out, err)
        line = error_line(err)
        assert line.startswith(f"pdexporter: error: --model {path}: {fragment}"), line
        assert "OFFLOAD" not in out.upper() and "offload:" not in out


def test_a_decision_document_that_is_not_utf8_is_one_line(tmp_path: Path, capsys) -> None:
    path = tmp_path / "decision.json"
    path.write_bytes(b'{"schema": "caf\xe9"}')
    code, _, err = run_cli(capsys, "decide", "-D", "4", "-P", "100", "--model", str(path))
    assert code == 2
    assert error_line(err) == (f"pdexporter: error: --model {path}: line 1: not UTF-8 text (byte 0xe9 at "
                               "offset 15)")


def test_the_committed_documents_still_answer(capsys) -> None:
    for name in ("h200-vllm0.22-qwen2.5-32b-instruct", "h200x2-arms"):
        code, out, err = run_cli(capsys, "decide", "-D", "4", "-P", "16384", "-B", B, "--model",
                                 str(ROOT / "results" / name / "decision.json"))
        assert code == 0, err
        assert out.strip()
