"""scripts/gpu/injected_blocks.py (GPU session 27): a spread run's injected table, some blocks only, from the
committed 1 req/s run, and a block no record holds is one line naming the record."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from pdexporter.measure.store import ResultsStore
from tests.helpers import REPO, gpu_script

INJECTED = REPO / "results" / "h100-vllm0.22-qwen3-coder-30b-a3b-passive-spread-1rps" / "injected"


def test_the_quiet_blocks_of_the_1rps_run_are_kept_and_re_aggregated(tmp_path: Path) -> None:
    out = tmp_path / "quiet"
    assert gpu_script("injected_blocks").keep_blocks(INJECTED, out, {1, 3, 5}) == 42 * 3
    records = list(ResultsStore(out).iter_records())
    assert len(records) == 42
    for record in records:
        assert sorted((r.model_extra or {})["block"] for r in record.reps) == [0, 2, 4]
        assert record.summary.reps_done == 3
    original = {r.config.decode_batch_size: r for r in ResultsStore(INJECTED).iter_records()
                if r.config.new_prefill_tokens == 512}
    quiet = {r.config.decode_batch_size: r for r in records if r.config.new_prefill_tokens == 512}
    # the busy blocks read slower at the launch-bound cells: without them the median falls (D = 8, P = 512)
    assert quiet[8].derived.aggregate_interference_ms < original[8].derived.aggregate_interference_ms


def test_a_block_no_record_holds_is_one_line(tmp_path: Path) -> None:
    result = subprocess.run([sys.executable, "scripts/gpu/injected_blocks.py", str(INJECTED), str(tmp_path / "x"),
                             "--blocks", "9"], cwd=REPO, capture_output=True, text=True, check=False, timeout=120)
    assert result.returncode == 2 and result.stderr == ""
    assert result.stdout.strip().endswith("no repetition of blocks [9]") and len(result.stdout.splitlines()) == 1
