"""`decision.json` described once (schema `pdexporter.decision/v2`): the typed form of the document
`export-table` writes and `decide`, `thresholds`, `report` and a router read.

`decision_eval` evaluates the document as plain dicts (a router can copy that module whole); this
module says what the dicts hold. `DecisionDocument.model_json_schema()` is shipped as
`pdexporter/analysis/schemas/decision.schema.json` for routers in other languages (a test holds the
file to the model, and every committed decision.json to both). Numbers are finite: a NaN or an
infinity anywhere is refused, naming the field (`validate_decision`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from pdexporter._internal.finite import first_not_finite
from pdexporter.errors import RecordError

__all__ = [
    "SCHEMA_FILE",
    "CampaignArmVariation",
    "ChunkRule",
    "ColocatedModel",
    "DecisionDocument",
    "Term",
    "TransferTerm",
    "TwoArm",
    "schema_json",
    "validate_decision",
]

SCHEMA_FILE = Path(__file__).parent / "schemas" / "decision.schema.json"

Finite = Field(allow_inf_nan=False)


class _Part(BaseModel):
    """A part of the document: known fields typed, fields a later version adds kept (extra allow)."""

    model_config = ConfigDict(extra="allow", allow_inf_nan=False)


class ChunkRule(_Part):
    """How a prompt is cut beside D running decodes (the engine adapter's rule)."""

    engine: str | None = None
    decodes_take_budget: bool = True
    decodes_in_chunk_step: bool = True
    graph_max_tokens: int = Field(0, ge=0)


class ColocatedModel(_Part):
    """The colocated cost model: the context-aware physical model or the seed's per-chunk one."""

    name: Literal["context_aware", "seed_per_chunk"]
    formula: str | None = None
    coefficients: dict[str, float | None] = Field(default_factory=dict)
    penalty_per_chunk_ms: dict[str, dict[str, list[float]]] | None = None
    graph_regime: str | None = None


class Term(_Part):
    """One two-arm term: non-negative coefficients over named features, with what it rests on."""

    features: list[str]
    coefficients: dict[str, float]
    range: dict[str, Any] | None = None
    n: int | None = None
    points: int | None = None
    held_out_r2: float | None = None
    held_out: str | None = None
    source: str | None = None
    meaning: str | None = None
    fit: str | None = None


class TransferTerm(_Part):
    """The KV transfer: latency + P x bytes per token / bandwidth, with its degraded regime."""

    source: str
    latency_ms: float | None = Field(None, ge=0)
    gb_per_s: float | None = Field(None, gt=0)
    bytes_per_token: float | None = Field(None, gt=0)
    fixed_ms: float | None = None
    ms_per_token: float | None = None
    degraded: dict[str, Any] | None = None


class TwoArm(_Part):
    """Both arms measured: the terms of the two-arm verdict."""

    version: int | None = None
    rule: str
    terms: dict[str, Term | TransferTerm | None]
    offloaded_setup: str | None = None
    measured_chunk_sizes: list[int] = Field(default_factory=list)
    source: str | None = None


class CampaignArmVariation(_Part):
    """The campaign-to-campaign variation of one arm's cost (`pdexporter validate`)."""

    log_sd: float = Field(ge=0)
    by_regime: dict[str, float] = Field(default_factory=dict)
    points: int | None = None
    campaigns: list[str] = Field(default_factory=list)


class DecisionDocument(_Part):
    """decision.json, schema pdexporter.decision/v2."""

    schema_: Literal["pdexporter.decision/v2"] = Field(alias="schema")
    rule: str
    cost: str | None = None
    chunk_rule: ChunkRule | None = None
    transfer_ms_default: float = Field(50.0, ge=0)
    model: ColocatedModel
    replicates: dict[str, list[dict[str, Any]]] | None = None
    fit: dict[str, Any] | None = None
    valid_range: dict[str, Any] | None = None
    thresholds_min_prefill_tokens: dict[str, dict[str, int | None]] | None = None
    modelled: bool = False
    engines: list[str] = Field(default_factory=list)
    source: str | None = None
    campaigns: list[str] | None = None
    campaign_variation: dict[str, Any] | None = None
    two_arm: TwoArm | None = None


def validate_decision(doc: Any, source: str = "decision.json") -> DecisionDocument:
    """The document typed, or one line naming the first field that is wrong and why."""
    bad = first_not_finite(doc)
    if bad is not None:
        what = "too large a number" if bad.too_large else "not a finite number (NaN or infinity)"
        raise RecordError(f"{source}: {bad.where or '(document)'}: {what}; re-run export-table")
    try:
        return DecisionDocument.model_validate(doc)
    except ValidationError as exc:
        err = exc.errors()[0]
        where = ".".join(str(x) for x in err["loc"]) or "(document)"
        raise RecordError(f"{source}: {where}: {err['msg']}") from None


def schema_json() -> str:
    """The JSON Schema of decision.json, as shipped (SCHEMA_FILE)."""
    schema = DecisionDocument.model_json_schema(by_alias=True)
    schema["$id"] = "https://pdexporter/schemas/decision.schema.json"
    schema["title"] = "pdexporter decision.json (pdexporter.decision/v2)"
    return json.dumps(schema, indent=1, sort_keys=True) + "\n"
