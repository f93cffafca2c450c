"""The seed's four success criteria, evaluated on the data, each pass/fail with its figure.

1. Interference is measurable: penalty_ratio > 1.1 for every grid point with D >= 4 and
   P >= 4096 (penalty_ratio = penalty / baseline, the seed's example 46.9 / 42.3 = 1.11).
2. Model fits: the chosen cost model's R^2 on HELD-OUT configurations > 0.85 (in-sample R^2 is
   reported beside it, never used for the verdict).
3. Break-even exists: some measured grid point (the seed's realistic range, D >= 1) has an
   aggregate interference cost above the transfer budget (50 ms by default). Measured, not
   modelled, so an extrapolating model cannot invent the region.
4. Reproducible: the coefficient of variation of the TPOT penalty across repetitions is < 15 %
   for every grid point with D >= 1 and at least two repetitions.

A criterion with no data to judge is reported as `passed: null` ("not evaluable"), never as a
pass.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from pdexporter.analysis.models import FitReport
from pdexporter.analysis.table import ConfigSamples

__all__ = [
    "CRITERIA_JSON", "Criterion", "break_even_exists", "criteria_document", "evaluate_criteria", "measurable",
    "model_fits", "reproducible",
]

CRITERIA_JSON = "criteria.json"


@dataclass(frozen=True)
class Criterion:
    number: int
    name: str
    statement: str
    passed: bool | None
    figure: str
    details: dict[str, Any] = field(default_factory=dict)

    @property
    def verdict(self) -> str:
        return {True: "PASS", False: "FAIL", None: "NOT EVALUABLE"}[self.passed]

    def to_dict(self) -> dict[str, Any]:
        return {"number": self.number, "name": self.name, "statement": self.statement, "passed": self.passed,
                "verdict": self.verdict, "figure": self.figure, "details": self.details}


def _where(row: pd.Series) -> str:
    return f"B={int(row['chunk_size'])} D={int(row['decode_batch_size'])} P={int(row['new_prefill_tokens'])}"


def measurable(table: pd.DataFrame, threshold: float = 1.1, min_d: int = 4, min_p: int = 4096) -> Criterion:
    subset = table[(table["decode_batch_size"] >= min_d) & (table["new_prefill_tokens"] >= min_p)]
    present = subset[subset["penalty_ratio"].notna()]
    statement = f"penalty_ratio > {threshold} for D >= {min_d} and P >= {min_p}"
    if present.empty:
        return Criterion(1, "Interference is measurable", statement, None,
                         f"no grid point with D >= {min_d}, P >= {min_p} and a penalty ratio")
    above = present["penalty_ratio"] > threshold
    worst = present.loc[present["penalty_ratio"].idxmin()]  # type: ignore[call-overload]  # stubs: label is Hashable
    figure = (f"{int(above.sum())}/{len(present)} points above {threshold}; "
              f"min ratio {worst['penalty_ratio']:.3f} at {_where(worst)}")
    failing = [_where(r) for _, r in present[~above].iterrows()]
    return Criterion(1, "Interference is measurable", statement, bool(above.all()), figure,
                     {"points": len(present), "above": int(above.sum()), "min_ratio": float(worst["penalty_ratio"]),
                      "failing": failing[:20]})


def model_fits(report: FitReport | None, threshold: float = 0.85) -> Criterion:
    statement = f"held-out R^2 of the cost model > {threshold}"
    if report is None:
        return Criterion(2, "Model fits", statement, None, "no model could be fitted (no point with D >= 1)")
    r2 = report.held_out_r2()
    others = {name: report.held_out_r2(name) for name in report.fits if name != report.chosen}
    if r2 is None:
        return Criterion(2, "Model fits", statement, None, "held-out R^2 undefined (too few points)")
    other_text = ", ".join(f"{n} {v:.4f}" if v is not None else f"{n} n/a" for n, v in others.items())
    figure = (f"held-out R^2 {r2:.4f} ({report.chosen}, {report.primary_scheme}); "
              f"in-sample {report.best.in_sample_r2:.4f}; other: {other_text}")
    return Criterion(2, "Model fits", statement, r2 > threshold, figure,
                     {"model": report.chosen, "scheme": report.primary_scheme, "held_out_r2": r2,
                      "in_sample_r2": report.best.in_sample_r2, "others": others})


def break_even_exists(table: pd.DataFrame, transfer_ms: float = 50.0) -> Criterion:
    rows = table[(table["decode_batch_size"] >= 1) & table["aggregate_interference_ms"].notna()]
    statement = f"some measured (D, P) has aggregate interference cost > {transfer_ms:g} ms"
    if rows.empty:
        return Criterion(3, "Break-even exists", statement, None, "no grid point with D >= 1 and a cost")
    over = rows[rows["aggregate_interference_ms"] > transfer_ms]
    # Where the region starts, per chunk size: the smallest P (and then D) that is over budget.
    frontier: dict[str, str] = {}
    b: Any  # pandas-stubs types a group key as any scalar; here a chunk size
    for b, group in over.groupby("chunk_size"):
        first = group.sort_values(["new_prefill_tokens", "decode_batch_size"]).iloc[0]
        frontier[str(int(b))] = f"D={int(first['decode_batch_size'])} P={int(first['new_prefill_tokens'])}"
    largest = rows.loc[rows["aggregate_interference_ms"].idxmax()]  # type: ignore[call-overload]  # stubs: label is Hashable
    figure = (f"{len(over)}/{len(rows)} points over {transfer_ms:g} ms; largest "
              f"{largest['aggregate_interference_ms']:.1f} ms at {_where(largest)}")
    if "8192" in frontier:
        figure += f"; at B=8192 from {frontier['8192']}"
    return Criterion(3, "Break-even exists", statement, len(over) > 0, figure,
                     {"points": len(rows), "over": len(over), "transfer_ms": transfer_ms,
                      "first_over_per_chunk_size": frontier,
                      "max_cost_ms": float(largest["aggregate_interference_ms"])})


def reproducible(table: pd.DataFrame, threshold: float = 0.15,
                 samples: Sequence[ConfigSamples] | None = None) -> Criterion:
    """Criterion 4; with the table's samples, each exception explained from its repetitions
    (`analysis.cv_causes`: the engine's chunk steps beside the penalty)."""
    rows = table[(table["decode_batch_size"] >= 1) & (table["reps"] >= 2) & table["cv_tpot_penalty"].notna()]
    statement = f"CV of the TPOT penalty across repetitions < {threshold:.0%} for every point"
    if rows.empty:
        return Criterion(4, "Reproducible", statement, None, "no grid point with D >= 1 and >= 2 repetitions")
    below = rows["cv_tpot_penalty"] < threshold
    worst = rows.loc[rows["cv_tpot_penalty"].idxmax()]  # type: ignore[call-overload]  # stubs: label is Hashable
    figure = (f"{int(below.sum())}/{len(rows)} points below {threshold:.0%}; max CV "
              f"{worst['cv_tpot_penalty']:.1%} at {_where(worst)}; median {rows['cv_tpot_penalty'].median():.1%}")
    if float(worst["cv_tpot_penalty"]) == 0.0:
        figure += " (repetitions identical: a deterministic engine, which says nothing about a GPU's noise)"
    details: dict[str, Any] = {"points": len(rows), "below": int(below.sum()),
                               "max_cv": float(worst["cv_tpot_penalty"]),
                               "median_cv": float(rows["cv_tpot_penalty"].median()),
                               "failing": [_where(r) for _, r in rows[~below].iterrows()][:20]}
    if samples is not None and not below.all():
        from pdexporter.analysis.cv_causes import explain_all

        exceptions = explain_all(samples, threshold)
        causes = Counter(e.cause for e in exceptions)
        figure += "; exceptions: " + ", ".join(f"{n} {cause}" for cause, n in causes.most_common())
        details["exceptions"] = [e.to_dict() for e in exceptions]
    return Criterion(4, "Reproducible", statement, bool(below.all()), figure, details)


def evaluate_criteria(table: pd.DataFrame, report: FitReport | None, transfer_ms: float = 50.0,
                      samples: Sequence[ConfigSamples] | None = None) -> list[Criterion]:
    return [measurable(table), model_fits(report), break_even_exists(table, transfer_ms),
            reproducible(table, samples=samples)]


def criteria_document(criteria: list[Criterion]) -> dict[str, Any]:
    verdicts = [c.passed for c in criteria]
    overall = None if any(v is None for v in verdicts) and all(v is not False for v in verdicts) else all(
        v is True for v in verdicts)
    return {"all_passed": overall, "criteria": [c.to_dict() for c in criteria]}
