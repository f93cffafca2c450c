"""Every committed H200 repetition analysed as an engine someone else runs gives it (no log: chunk
steps from vLLM's schedule, confirmed by the probes' cadence), against its analysis with vLLM's
step log.

Beside a production vLLM nobody reads the step log, so the number a user gets must not depend
on it. This runs over all raw files of `results/h200-*` (the seed's sweep: 168 configurations
with D >= 1, 1,505 repetitions) and prints the distribution of the differences. The with-log side
is the committed records themselves: `scripts/results.sh` re-derives them (`reanalyse`, with the
log) after every change to the window maths, and a sample of every directory is re-derived here to
hold that (`records_are_the_log_analysis`); deriving all of them again doubled this module's ~55 s
of CPU.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from pdexporter.measure.protocol import ProtocolSettings
from pdexporter.measure.store import ResultsStore, load_record_file
from pdexporter.sweep.reanalyse import SourceComparison, compare_sources, records_are_the_log_analysis

# Every committed H200 results directory with records: the seed's sweep, and the later ones (a chunk
# size and decode batches in no grid, the offloaded arm, the two-GPU sweeps) that the estimator was
# not chosen on.
RESULTS = sorted(p for p in (Path(__file__).parents[3] / "results").glob("h200*")
                 if any(p.glob("*/D*_P*.json")))
SEED_SWEEP = Path(__file__).parents[3] / "results" / "h200-vllm0.22-qwen3-coder-30b-a3b"
pytestmark = pytest.mark.slow  # every committed H200 repetition analysed twice


@pytest.fixture(scope="module", params=RESULTS, ids=[p.name for p in RESULTS])
def comparisons(request: pytest.FixtureRequest) -> list[SourceComparison]:
    store = ResultsStore(request.param)
    records = [load_record_file(p) for p in store.iter_record_paths()]
    rows = compare_sources(store, records, ProtocolSettings(), logged="recorded")
    diffs = np.array([r.relative_difference for r in rows if r.relative_difference is not None]) * 100
    cv_points = np.array([(r.cv_cadence - r.cv_log) * 100 for r in rows
                          if r.cv_cadence is not None and r.cv_log is not None])
    q = [0, 10, 50, 90, 100]
    print(f"\n{request.param.name}: {len(rows)} configurations with D >= 1, {sum(r.reps for r in rows)} repetitions")
    print("  penalty without log vs with, % (min/p10/p50/p90/max):", np.percentile(diffs, q).round(2))
    print("  penalty CV without log minus with, points:          ", np.percentile(cv_points, q).round(2))
    print(f"  configurations within 5 % (2 ms under 40 ms): {sum(r.penalty_agrees() for r in rows)}/{len(rows)}; "
          f"repetitions with the log's chunk steps: {sum(r.reps_same_steps for r in rows)}/{sum(r.reps for r in rows)}")
    return rows


@pytest.mark.parametrize("results", RESULTS, ids=[p.name for p in RESULTS])
def test_the_committed_records_are_the_log_analysis_as_the_window_maths_stands(results: Path) -> None:
    """What the comparisons take as the with-log side: a sample of each directory (its first, middle
    and last records of D >= 1) re-derived with the log gives the committed numbers again."""
    store = ResultsStore(results)
    paths = [p for p in store.iter_record_paths() if "/D0_" not in p.as_posix()]
    sample = [load_record_file(p) for p in sorted({paths[0], paths[len(paths) // 2], paths[-1]})]
    assert sample and all(r.config.decode_batch_size > 0 for r in sample)
    assert records_are_the_log_analysis(store, sample, ProtocolSettings()) == [], \
        f"{results}: re-derive it (`pdexporter reanalyse`, scripts/results.sh) after changing the window maths"


def test_there_are_h200_results_to_check() -> None:
    assert SEED_SWEEP in RESULTS and len(RESULTS) >= 2, RESULTS


def test_penalty_without_the_engine_log_matches_the_log(comparisons: list[SourceComparison]) -> None:
    assert comparisons
    agree = [r for r in comparisons if r.penalty_agrees(rel=0.05, abs_ms=2.0, small_ms=40.0)]
    worst = sorted(comparisons, key=lambda r: -abs(r.relative_difference or 0))[:3]
    assert len(agree) >= 0.95 * len(comparisons), [(r.key, r.penalty_log_ms, r.penalty_cadence_ms) for r in worst]


def test_penalty_cv_without_the_engine_log_is_no_worse(comparisons: list[SourceComparison]) -> None:
    ok = [r for r in comparisons if r.cv_agrees(points=0.03)]
    assert len(ok) >= 0.95 * len(comparisons)


def test_chunk_steps_located_without_the_log_are_the_logs(comparisons: list[SourceComparison]) -> None:
    same = sum(r.reps_same_steps for r in comparisons)
    total = sum(r.reps for r in comparisons)
    assert same >= 0.95 * total


def test_a_tail_the_cadence_cannot_see_is_reported_unseen() -> None:
    """B=2048, D=1, P=2048: a 2047-token chunk and a 1-token tail that runs like a decode step.
    With the log the record says 2 chunks; without it, the 1 the probes saw, never the schedule's 2."""
    from pdexporter.sweep.reanalyse import reanalyse_record

    store = ResultsStore(SEED_SWEEP)
    record = load_record_file(store.record_path(2048, 1, 2048))
    logged = reanalyse_record(store, record, ProtocolSettings()).record
    blind = reanalyse_record(store, record, ProtocolSettings(), use_engine_log=False).record
    for a, b in zip(logged.reps, blind.reps):
        assert a.interference.num_chunks_source == "engine-log" and a.interference.num_chunks_actual == 2
        assert b.interference.num_chunks_source == "cadence" and b.interference.num_chunks_expected == 2
        assert b.interference.num_chunks_actual == b.interference.num_chunks_seen == 1
        # the penalty weighs the tail by its one token: it is the 2047-token chunk's, both ways
        assert a.derived.tpot_penalty_p50_ms == b.derived.tpot_penalty_p50_ms
        assert b.derived.tpot_penalty_p50_ms > 20


@pytest.mark.slow
def test_committed_records_reanalyse_to_the_committed_table() -> None:
    """The window maths and the table code as they are now reproduce the committed H200 table from
    the raw files: a change to either that moves a number shows here (re-analyse and commit)."""
    import pandas as pd

    from pdexporter.analysis.table import SEED_COLUMNS, build_table, samples_from_record
    from pdexporter.sweep.reanalyse import reanalyse_record

    store = ResultsStore(SEED_SWEEP)
    settings = ProtocolSettings()
    records = [reanalyse_record(store, load_record_file(p), settings).record for p in store.iter_record_paths()]
    table = build_table(samples_from_record(r) for r in records)
    committed = pd.read_csv(SEED_SWEEP / "interference_table.csv")
    assert len(table) == len(committed) == 196
    merged = committed.merge(table, on=list(SEED_COLUMNS[:3]), suffixes=("_committed", "_now"))
    for column in SEED_COLUMNS[3:]:
        a, b = merged[f"{column}_committed"], merged[f"{column}_now"]
        assert np.allclose(a.astype(float), b.astype(float), rtol=1e-3, atol=1e-3, equal_nan=True), column
