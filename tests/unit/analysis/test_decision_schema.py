"""decision.json described once (`analysis.decision_schema`): the shipped JSON Schema is the typed
model's, every committed decision document satisfies both, and a document with a NaN, an unknown
model or a missing field is refused in one line naming the field."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest

from pdexporter.analysis.decision_schema import SCHEMA_FILE, schema_json, validate_decision
from pdexporter.errors import RecordError
from tests.helpers import cli_env

ROOT = Path(__file__).resolve().parents[3]
COMMITTED = sorted((ROOT / "results").rglob("decision.json"))


def test_the_shipped_schema_is_the_typed_models() -> None:
    assert SCHEMA_FILE.read_text() == schema_json(), "regenerate: python -c 'from pdexporter.analysis." \
        "decision_schema import *; SCHEMA_FILE.write_text(schema_json())'"


@pytest.mark.parametrize("path", COMMITTED, ids=lambda p: p.parent.name)
def test_every_committed_decision_document_satisfies_the_schema(path: Path) -> None:
    doc = json.loads(path.read_text())
    jsonschema.validate(doc, json.loads(SCHEMA_FILE.read_text()))
    typed = validate_decision(doc, str(path))
    assert typed.model.name in ("context_aware", "seed_per_chunk")


def doc() -> dict:
    return json.loads((ROOT / "results" / "h200x2-arms" / "decision.json").read_text())


def test_a_nan_anywhere_is_refused_naming_the_field() -> None:
    d = doc()
    d["replicates"]["model"][7]["gamma_ms_per_token"] = float("nan")
    with pytest.raises(RecordError, match=r"x: replicates.model\[7\].gamma_ms_per_token: not a finite number"):
        validate_decision(d, "x")
    d = doc()
    d["two_arm"]["terms"]["offloaded_loss"]["coefficients"]["p"] = float("inf")
    with pytest.raises(RecordError, match="two_arm.terms.offloaded_loss.coefficients.p: not a finite"):
        validate_decision(d, "x")


def test_a_wrong_field_is_refused_naming_it() -> None:
    d = doc()
    d["model"]["name"] = "linear"
    with pytest.raises(RecordError, match="x: model.name: "):
        validate_decision(d, "x")
    d = doc()
    del d["rule"]
    with pytest.raises(RecordError, match="x: rule: required field is missing"):
        validate_decision(d, "x")


def test_decide_refuses_a_nan_decision_in_one_line(tmp_path: Path) -> None:
    text = (ROOT / "results" / "h200x2-arms" / "decision.json").read_text()
    d = json.loads(text)
    d["model"]["coefficients"]["alpha0_ms"] = float("nan")
    bad = tmp_path / "decision.json"
    bad.write_text(json.dumps(d))  # json writes NaN as the bare literal, which json.loads reads back
    run = subprocess.run([sys.executable, "-m", "pdexporter", "decide", "-D", "4", "-P", "4096", "-B", "8192",
                          "--model", str(bad)], capture_output=True, text=True, env=cli_env(), timeout=120)
    assert run.returncode != 0
    assert "model.coefficients.alpha0_ms" in run.stderr and "not a finite number" in run.stderr
    assert "Traceback" not in run.stderr and len(run.stderr.strip().splitlines()) == 1
