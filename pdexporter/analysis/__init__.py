"""Batch analysis of interference records: table, cost models, break-even, criteria, plots, report.

Pipeline (pure core, thin I/O edges; `job` wires it; the commands call their jobs: `export`
(export-table, report), `comparisons` (compare, validate-pd), `verdicts` (decide, thresholds)):

    records / Prometheus -> table.ConfigSamples -> table.build_table -> models.fit_models
        -> breakeven.decision_document -> criteria.evaluate_criteria -> plots / report

This module stays import-light (no pandas, numpy or matplotlib) so the CLI starts fast; import
the submodules for the work.
"""

__all__ = [
    "DECISION_JSON", "DECISION_SCHEMA", "DEFAULT_TRANSFER_MS",
]

DEFAULT_TRANSFER_MS = 50.0  # the seed's layer-wise transfer budget
DECISION_SCHEMA = "pdexporter.decision/v2"  # = decision_eval.SCHEMA (a test holds them equal)
DECISION_JSON = "decision.json"
