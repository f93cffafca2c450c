"""scripts/eager_levels.py (where the one-chunk step's level lives; GPU session 37): the committed records re-read
into the committed levels.md, the plan's fixed reading on each of its outcomes, the block state's arithmetic, and a
folder without records as one line naming it."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from tests.helpers import REPO

RUN = REPO / "results" / "h100-vllm0.22-llama-3.2-3b-instruct-levels"


@pytest.fixture(scope="module")
def levels():  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location("eager_levels", REPO / "scripts" / "eager_levels.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_committed_run_gives_the_committed_levels_md(levels) -> None:  # type: ignore[no-untyped-def]
    text = levels.report(RUN, None)
    assert text + "\n" == (RUN / "levels.md").read_text()
    assert "**Verdict: the engine's own (not the host's launch path).**" in text


def _levels(ratio: list[float], launch: list[float], p: int = 512) -> pd.DataFrame:
    return pd.DataFrame({"P": p, "chunks": 1, "ratio": ratio, "launch_us": launch})


def test_the_plans_reading_on_each_outcome(levels) -> None:  # type: ignore[no-untyped-def]
    rng = np.random.default_rng(0)
    ratio = [0.7] * 20 + [1.0] * 10 + [1.4] * 20
    control = _levels([0.95, 1.05, 0.95, 1.05] * 8, [9.0, 9.0, 11.0, 11.0] * 8, p=4096)  # r = 0: no level
    tracks = pd.concat([_levels(ratio, [5.0 + x for x in rng.normal(0, 0.2, 20)] + [7.0] * 10
                                + [10.0 + x for x in rng.normal(0, 0.2, 20)]), control])
    assert levels.verdict(tracks, [5, 7, 10], 4096)[0] == "the launch path sets the level"
    flat = pd.concat([_levels(ratio, list(rng.normal(14, 1, 50))), control])
    name, lines = levels.verdict(flat, [9, 14, 21], 4096)
    assert name == "the engine's own (not the host's launch path)"
    assert "fast (< 0.9) 40%, slow (> 1.1) 40%" in lines[0] and "p90 / p10" in lines[2]
    one_level = pd.concat([_levels([1.0] * 48 + [1.3, 0.7], list(rng.normal(14, 1, 50))), control])
    assert levels.verdict(one_level, [14, 15], 4096)[0] == "inconclusive (one level held the run)"


def test_the_block_state_pairs_the_small_prompts_with_the_control(levels) -> None:  # type: ignore[no-untyped-def]
    # six blocks: the small prompts' steps high where the control's are low, 2 s apart
    state = [0.8, 1.2, 0.9, 1.3, 0.7, 1.1]
    rows = [{"block": b, "t": 2.0 * b + 0.1 * i, "P": p, "step_ratio": s if p < 4096 else 2 - s}
            for b, s in enumerate(state) for i, p in enumerate((512, 1024, 4096))]
    blocks = levels.block_state(pd.DataFrame(rows), 4096)
    assert list(blocks.small.round(2)) == state and blocks.small.corr(blocks.big) == pytest.approx(-1.0)
    gpu = pd.DataFrame({"t": [2.0 * b + 0.05 for b in range(6)], "sm_mhz": 1980.0,
                        "power_w": [400 + 100 * (s - 1) for s in state], "cap": False})
    text = "\n".join(levels.block_lines(blocks, gpu, 4096))
    assert "**-1.00**" in text and "power_w (mean 400.00): r with P < 4096 +1.00" in text


def test_a_folder_without_records_is_one_line(tmp_path: Path) -> None:
    result = subprocess.run([sys.executable, "scripts/eager_levels.py", str(tmp_path)], cwd=REPO,
                            capture_output=True, text=True, check=False, timeout=60)
    assert result.returncode == 1
    assert result.stderr.strip() == f"{tmp_path}: no repetitions of a D > 0 configuration under {{chunk}}/D*_P*.json"


def test_the_profilers_windows_leave_their_repetitions_out(levels, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    df = levels.repetitions(RUN)
    t0 = df.t.min()
    windows = tmp_path / "windows.jsonl"  # two windows of 10 s, 60 s and 120 s into the sweep (the records' clock)
    windows.write_text("\n".join(json.dumps({"window": i, "start": [int((t0 + a) * 1e9)] * 2,
                                             "stop": [int((t0 + a + 10) * 1e9)] * 2, "ok": True, "error": ""})
                                 for i, a in enumerate((60, 120))) + "\n")
    kept = levels.outside_windows(df, windows)
    inside = df[(df.t.between(t0 + 59, t0 + 71)) | (df.t.between(t0 + 119, t0 + 131))]
    assert len(kept) == len(df) - len(inside) and 50 < len(inside) < 150  # ~0.27 s a window
    assert not kept.t.between(t0 + 60, t0 + 70).any()
    text = levels.report(RUN, None, windows)
    assert f"{len(inside)} repetitions inside the profiler's windows (windows.jsonl) are left out." in text
