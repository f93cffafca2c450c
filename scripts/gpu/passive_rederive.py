"""A passive run's records re-derived from their committed raw timestamps with the current window maths
(`measure.window`), into another directory: `pdexporter reanalyse` keeps `run --passive` records as measured
(no Phase 1 file holds an event's baseline), so this does for them what it does for injected records. Each
event keeps what the exporter decided live (its run of slow steps as t_inject / t_first, its D and P, its
attribution, its quiet-period baseline: p50/p90/p99/mean from the record, the MAD backed out of the recorded
slow threshold where the MAD set it) and gets its window numbers (`interference`, `derived`) again. The raw
files are not copied or touched; `requests.jsonl` is copied (the event model reads the prompt sizes of joint events
from it).

    python3 scripts/gpu/passive_rederive.py PASSIVE_DIR OUT_DIR   # prints how many events moved, and how much
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from pdexporter.measure.passive import JOINT_DIR, MERGED_DIR, REQUESTS_LOG  # noqa: E402
from pdexporter.measure.protocol import StreamTrace, analyse_traces, chunks_expected, expected_schedule  # noqa: E402
from pdexporter.measure.records import aggregate, derived_block, interference_block  # noqa: E402
from pdexporter.measure.store import ResultsStore  # noqa: E402
from pdexporter.measure.window import BaselineStats, WindowParams, derive  # noqa: E402

PARAMS = WindowParams()  # what `run --passive` analysed with (PassiveSettings.window's default)


def _baseline(rep) -> BaselineStats:  # type: ignore[no-untyped-def]
    b, theta = rep.baseline, rep.interference.slow_step_threshold_ms
    over = (theta - b.tpot_p50_ms) if theta is not None else 0.0
    mad = over / (PARAMS.slow_mad_k * 1.4826) if over > PARAMS.slow_rel * b.tpot_p50_ms * (1 + 1e-6) else 0.0
    return BaselineStats(b.tpot_p50_ms, b.tpot_p90_ms, b.tpot_p99_ms, b.tpot_mean_ms, mad, b.n_intervals)


def rederive(src: Path, out: Path) -> list[tuple[float, float]]:
    moved: list[tuple[float, float]] = []
    for sub in ("", JOINT_DIR, MERGED_DIR):
        store = ResultsStore(src / sub if sub else src)
        dest = ResultsStore(out / sub if sub else out)
        for record in store.iter_records():
            c = record.config
            reps = []
            for rep in record.reps:
                info = (rep.model_extra or {}).get("passive") or {}
                if rep.raw is None:
                    reps.append(rep)
                    continue
                raw = store.load_raw(store.chunk_dir(c.chunk_size) / rep.raw)
                probes = [StreamTrace.from_raw(p) for p in raw["probes"]]
                d, p = int(info["decode_batch_size"]), int(info["prompt_tokens"])
                base = _baseline(rep)
                schedule = expected_schedule(c.engine, p, c.chunk_size, d)
                window = analyse_traces(probes, raw.get("t_inject_ns", 0), raw["t_first_ns"], base, PARAMS, None,
                                        schedule, engine=c.engine)
                new = rep.model_copy(update={
                    "interference": interference_block(
                        window, num_chunks_expected=chunks_expected(c.engine, schedule), engine_chunks=None,
                        prefill_prompt_tokens=p, prompt_tokens_check=rep.interference.prompt_tokens_check),
                    "derived": derived_block(derive(base, window, d)),
                })
                old_t, new_t = rep.derived.total_interference_ms, new.derived.total_interference_ms
                if old_t is not None and new_t is not None and abs(new_t - old_t) > 1e-3:
                    moved.append((old_t, new_t))
                reps.append(new)
            dest.save_record(aggregate(c, reps).model_copy(update={"provenance": record.provenance}))
    if (src / REQUESTS_LOG).exists():
        shutil.copy(src / REQUESTS_LOG, out / REQUESTS_LOG)
    return moved


if __name__ == "__main__":
    src, out = Path(sys.argv[1]), Path(sys.argv[2])
    moved = rederive(src, out)
    ratios = np.array([n / o for o, n in moved if o]) if moved else np.ones(0)
    spread = (f" (new/old median {np.median(ratios):.3f}, min {ratios.min():.3f}, max {ratios.max():.3f})"
              if moved else "")
    print(f"{src}: {len(moved)} events' total interference moved{spread}")
