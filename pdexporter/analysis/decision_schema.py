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

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from pdexporter._internal.finite import first_not_finite
from pdexporter._internal.validation import close_match, format_validation_error
from pdexporter.analysis.decision_eval import chunk_context
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

# the features a linear term may name (`decision_eval.chunk_context`'s `f`)
FEATURES: tuple[str, ...] = tuple(chunk_context({}, 0, 1, 1)["f"])
# the two-arm terms the verdict cannot do without (`decision_eval.evaluate_arms`); the others
# (prefill_offset, offloaded_tpot) are absent where the offloaded arm did not measure them
REQUIRED_TERMS = ("colocated_ttft", "decode_side", "offloaded_loss", "transfer")
KNOWN_TERMS = (*REQUIRED_TERMS, "prefill_offset", "offloaded_tpot")
# the context-aware model's coefficients `decision_eval.colocated_cost` reads without a default
REQUIRED_COEFFICIENTS = ("alpha0_ms", "alpha1_ms_per_decode", "gamma_ms_per_token", "beta_ms_per_token_pair")


class _Part(BaseModel):
    """A part of the document: known fields typed, fields a later version adds kept (extra allow)."""

    model_config = ConfigDict(extra="allow", allow_inf_nan=False)


class ChunkRule(_Part):
    """How a prompt is cut beside D running decodes (the engine adapter's rule)."""

    engine: str | None = None
    decodes_take_budget: bool = True
    decodes_in_chunk_step: bool = True
    graph_max_tokens: int = Field(0, ge=0)
    graph_sizes: list[int] = Field(default_factory=list)  # the captured sizes a graph step is padded to


class ColocatedModel(_Part):
    """The colocated cost model: the context-aware physical model or the seed's per-chunk one."""

    name: Literal["context_aware", "seed_per_chunk"]
    formula: str | None = None
    coefficients: dict[str, float | None] = Field(default_factory=dict)
    penalty_per_chunk_ms: dict[str, dict[str, list[float]]] | None = None
    graph_regime: str | None = None

    @model_validator(mode="after")
    def _usable(self) -> ColocatedModel:
        """What `decision_eval.colocated_cost` reads is there: the seed's table per chunk size (an
        integer key, D ascending, as many penalties as Ds), the context-aware model's coefficients."""
        if self.name == "context_aware":
            _require_coefficients(self.coefficients, "model.coefficients")
            return self
        if not self.penalty_per_chunk_ms:
            raise ValueError("model.penalty_per_chunk_ms: required for the seed_per_chunk model (one entry per "
                             "chunk size)")
        for size, entry in self.penalty_per_chunk_ms.items():
            where = f"model.penalty_per_chunk_ms.{size}"
            if not (size.isascii() and size.isdigit() and int(size) > 0):
                raise ValueError(f"{where}: the key must be a chunk size, a positive integer (got {size!r})")
            for field in ("decode_batch_size", "penalty_ms"):
                if field not in entry:
                    raise ValueError(f"{where}.{field}: required field is missing")
                if not entry[field]:
                    raise ValueError(f"{where}.{field}: must have at least 1 item")
            ds, pis = entry["decode_batch_size"], entry["penalty_ms"]
            if len(ds) != len(pis):
                raise ValueError(f"{where}.penalty_ms: {len(pis)} item(s), one per decode_batch_size "
                                 f"({len(ds)} given)")
            for i in range(1, len(ds)):
                if ds[i] <= ds[i - 1]:
                    raise ValueError(f"{where}.decode_batch_size[{i}]: must be larger than the one before it "
                                     f"(got {ds[i]:g} after {ds[i - 1]:g})")
            for i, d in enumerate(ds):
                if d < 0:
                    raise ValueError(f"{where}.decode_batch_size[{i}]: must be >= 0 (got {d:g})")
        return self


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

    @model_validator(mode="after")
    def _usable(self) -> Term:
        """Every feature is one `decision_eval.chunk_context` computes, and has its coefficient."""
        for i, name in enumerate(self.features):
            if name not in FEATURES:
                match = close_match(name, FEATURES)
                hint = f"did you mean {match}?" if match else f"expected one of: {', '.join(FEATURES)}"
                raise ValueError(f"features[{i}]: unknown feature {name!r} ({hint})")
            if name not in self.coefficients:
                raise ValueError(f"coefficients.{name}: required field is missing (features[{i}] names it)")
        return self


class TransferTerm(_Part):
    """The KV transfer: latency + P x bytes per token / bandwidth, with its degraded regime."""

    source: str
    latency_ms: float | None = Field(None, ge=0)
    gb_per_s: float | None = Field(None, gt=0)
    bytes_per_token: float | None = Field(None, gt=0)
    fixed_ms: float | None = None
    ms_per_token: float | None = None
    degraded: dict[str, Any] | None = None

    @model_validator(mode="after")
    def _usable(self) -> TransferTerm:
        """A measured or given transfer has the numbers `decision_eval.transfer_time` reads: latency,
        bandwidth and bytes per token (or a v1 document's fixed_ms and ms_per_token)."""
        if self.source not in ("measured", "given"):
            return self
        v1 = "gb_per_s" not in self.model_fields_set and self.fixed_ms is not None
        names = ("fixed_ms", "ms_per_token") if v1 else ("latency_ms", "gb_per_s", "bytes_per_token")
        for name in names:
            if getattr(self, name) is None:
                what = "must be a number (got null)" if name in self.model_fields_set else "required field is missing"
                raise ValueError(f"{name}: {what} (a {self.source} transfer)")
        return self


class TwoArm(_Part):
    """Both arms measured: the terms of the two-arm verdict."""

    version: int | None = None
    rule: str
    terms: dict[str, Term | TransferTerm | None]
    offloaded_setup: str | None = None
    measured_chunk_sizes: list[int] = Field(default_factory=list)
    source: str | None = None

    @model_validator(mode="before")
    @classmethod
    def _terms(cls, data: Any) -> Any:
        """Each term validated as what its name says it is (`transfer` a TransferTerm, the others a
        Term: the union alone took a term with a bad coefficient for a transfer), and the terms the
        verdict needs present."""
        terms = data.get("terms") if isinstance(data, dict) else None
        if not isinstance(terms, dict):
            return data  # the field's own check names it
        for name in REQUIRED_TERMS:
            if terms.get(name) is None:
                strangers = [str(k) for k in terms if k not in KNOWN_TERMS]
                match = close_match(name, strangers)
                hint = f"; found {match} (a typo?)" if match else ""
                state = "is null" if name in terms else "is missing"
                raise ValueError(f"two_arm.terms.{name}: required term {state}{hint} (re-run export-table)")
        for name, term in terms.items():
            if term is None:
                continue
            if not isinstance(term, dict):
                raise ValueError(f"two_arm.terms.{name}: must be a mapping (got {term!r:.60})")
            model: type[BaseModel] = TransferTerm if name == "transfer" else Term
            try:
                model.model_validate(term)
            except ValidationError as exc:
                text = format_validation_error(exc, model)
                raise ValueError(f"two_arm.terms.{name}{'' if text.startswith('[') else '.'}{text}") from None
        return data


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

    @model_validator(mode="after")
    def _replicates_usable(self) -> DecisionDocument:
        """Every bootstrap replicate holds what an interval reads of it (the audit: a replicate
        without a coefficient was a KeyError, a shorter `two_arm` list an IndexError, a shorter
        `campaign` list intervals silently without the campaign variation)."""
        reps = self.replicates or {}
        model = reps.get("model") or []
        for i, k in enumerate(model):
            _numbers(k, f"replicates.model[{i}]")
            if self.model.name == "context_aware":
                _require_coefficients(k, f"replicates.model[{i}]")
        lists = {"two_arm": self.two_arm is not None, "campaign": bool(self.campaign_variation)}
        for key, needed_here in lists.items():
            if model and needed_here and len(reps.get(key) or []) != len(model):
                raise ValueError(f"replicates.{key}: {len(reps.get(key) or [])} item(s), one per replicates.model "
                                 f"({len(model)} given; re-run export-table)")
        for i, draw in enumerate(reps.get("campaign") or []):
            _numbers(draw, f"replicates.campaign[{i}]")
        if self.two_arm is not None:
            for i, entry in enumerate(reps.get("two_arm") or []):
                _arm_replicate(entry, self.two_arm, f"replicates.two_arm[{i}]")
        return self


def _require_coefficients(coefficients: dict[str, Any], where: str) -> None:
    """The context-aware model's coefficients `decision_eval.colocated_cost` reads, each a number
    (the central model's and every bootstrap replicate's)."""
    for name in REQUIRED_COEFFICIENTS:
        if coefficients.get(name) is None:
            what = "must be a number (got null)" if name in coefficients else "required field is missing"
            raise ValueError(f"{where}.{name}: {what}")


def _numbers(values: Any, where: str) -> None:
    """A mapping of names to numbers (null allowed), or one line naming the first that is not."""
    if not isinstance(values, dict):
        raise ValueError(f"{where}: must be a mapping (got {values!r:.60})")
    for name, value in values.items():
        if value is not None and (isinstance(value, bool) or not isinstance(value, int | float)):
            raise ValueError(f"{where}.{name}: must be a number (got {value!r:.60})")


def _arm_replicate(entry: Any, arms: TwoArm, where: str) -> None:
    """One replicate's two-arm coefficients: each term it gives has every feature of its term."""
    if not isinstance(entry, dict):
        raise ValueError(f"{where}: must be a mapping (got {entry!r:.60})")
    for name, k in entry.items():
        _numbers(k, f"{where}.{name}")
        term = arms.terms.get(name)
        if isinstance(term, Term):
            missing = [f for f in term.features if k.get(f) is None]
            if missing:
                raise ValueError(f"{where}.{name}.{missing[0]}: required field is missing "
                                 f"(two_arm.terms.{name} has the feature)")


def validate_decision(doc: Any, source: str = "decision.json") -> DecisionDocument:
    """The document typed, or one line naming the first field that is wrong and why."""
    bad = first_not_finite(doc)
    if bad is not None:
        what = "too large a number" if bad.too_large else "not a finite number (NaN or infinity)"
        raise RecordError(f"{source}: {bad.where or '(document)'}: {what}; re-run export-table")
    try:
        return DecisionDocument.model_validate(doc)
    except ValidationError as exc:
        raise RecordError(f"{source}: {format_validation_error(exc, DecisionDocument)}") from None


def schema_json() -> str:
    """The JSON Schema of decision.json, as shipped (SCHEMA_FILE)."""
    schema = DecisionDocument.model_json_schema(by_alias=True)
    schema["$id"] = "https://pdexporter/schemas/decision.schema.json"
    schema["title"] = "pdexporter decision.json (pdexporter.decision/v2)"
    return json.dumps(schema, indent=1, sort_keys=True) + "\n"
