"""Every window quantity is declared once (`measure.quantities`); records, the table, the gauges,
the Prometheus pull, the spans and docs/metrics.md follow that declaration."""

from __future__ import annotations

import sys
from pathlib import Path

from pdexporter.analysis.table import COLUMNS, INT_VALUES, REP_VALUES, SEED_COLUMNS
from pdexporter.exporter import prometheus as pull
from pdexporter.exporter.metrics import WINDOW_GAUGES, ExporterMetrics
from pdexporter.measure.pd import OffloadNumbers
from pdexporter.measure.quantities import QUANTITIES, gauged, in_block, markdown_table, seed_record_keys, tabulated
from pdexporter.measure.records import SEED_KEYS, BaselineBlock, DerivedBlock, InterferenceBlock
from pdexporter.measure.window import BaselineStats, Derived, WindowStats

ROOT = Path(__file__).parents[3]
MODELS = {"baseline": BaselineBlock, "interference": InterferenceBlock, "derived": DerivedBlock}
SOURCES = {"baseline": BaselineStats, "window": WindowStats, "derived": Derived, "offload": OffloadNumbers}


def test_names_are_unique() -> None:
    for attr in ("column", "gauge", "span"):
        names = [getattr(q, attr) for q in QUANTITIES if getattr(q, attr)]
        assert len(names) == len(set(names)), attr
    assert len({(q.block, q.field) for q in QUANTITIES}) == len(QUANTITIES)


def test_record_blocks_are_the_declared_quantities_with_the_seeds_keys_first() -> None:
    for block, model in MODELS.items():
        fields = list(model.model_fields)
        declared = [q.field for q in in_block(block)]
        assert set(declared) <= set(fields)
        assert fields[: len(SEED_KEYS[block])] == list(SEED_KEYS[block])
        assert set(seed_record_keys(block)) == set(SEED_KEYS[block])
        # nothing numeric in a block that is not declared
        numeric = [f for f, info in model.model_fields.items() if info.annotation in (int | None, float | None)]
        assert set(numeric) == set(declared), block


def test_every_source_is_an_attribute_of_the_window_maths() -> None:
    for q in QUANTITIES:
        owner, attribute = q.source.split(".", 1)
        if owner == "context":
            continue
        cls = SOURCES[owner]
        assert attribute in getattr(cls, "__dataclass_fields__", {}) or hasattr(cls, attribute), q.source


def test_table_columns_follow_the_declaration() -> None:
    assert SEED_COLUMNS == ("chunk_size", "decode_batch_size", "new_prefill_tokens", "tpot_baseline_ms",
                            "tpot_interference_ms", "tpot_penalty_ms", "penalty_ratio", "num_chunks",
                            "prefill_duration_ms")  # the seed's header, verbatim
    assert REP_VALUES == tuple(q.column for q in tabulated())
    assert set(REP_VALUES) <= set(COLUMNS)
    assert INT_VALUES == {q.column for q in tabulated("offloaded") if q.unit in ("count", "bytes")}
    # the offloaded arm's columns are declared too, and only its tables carry them
    arm = [q.column for q in tabulated("offloaded") if q.arm == "offloaded"]
    assert arm and not set(arm) & set(COLUMNS)


def test_gauges_and_the_prometheus_pull_follow_the_declaration() -> None:
    metrics = ExporterMetrics()
    assert set(metrics.window_gauges) == {q.gauge_name for q in gauged()} == set(WINDOW_GAUGES)
    for name, (column, factor) in pull.WINDOW_GAUGES.items():
        q = WINDOW_GAUGES[name]
        assert column == q.column and factor * q.gauge_factor == 1.0
    assert all(q.gauge_name in pull.WINDOW_GAUGES for q in gauged() if q.column)


def test_docs_carry_the_generated_table() -> None:
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        import gen_docs
    finally:
        sys.path.pop(0)
    text = (ROOT / "docs" / "metrics.md").read_text(encoding="utf-8")
    assert markdown_table() in text
    assert gen_docs.render(text) == text, "docs/metrics.md is stale: run python scripts/gen_docs.py"
