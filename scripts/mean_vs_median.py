"""How far two runs of the same configurations moved, by the median and by the mean of their repetitions.

    python scripts/mean_vs_median.py START_DIR END_DIR [START_DIR END_DIR ...] [--out FILE.md]

For one-chunk eager prompts (P 512-2048, one chunk) whose penalty the first run resolves (median >= 20 % of its
decode step, criterion 4's near-zero rule), per pair: the median over configurations of |end / start - 1| of the
repetitions' median penalty and of their mean. With many repetitions of a two-level quantity the mean moves less
than the median, which flips with the levels' shares crossing a half; with three it need not (GPU session 37,
`results/h100-vllm0.22-llama-3.2-3b-instruct-levels/RUN.md`). Pure arithmetic on committed records.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pdexporter._internal.atomic import atomic_write_text  # noqa: E402
from pdexporter.analysis.cv_causes import NEAR_ZERO  # noqa: E402 (criterion 4's near-zero rule)

ONE_CHUNK = (512, 2048)


def cells(run: Path) -> dict[tuple[int, int, int], tuple[list[float], float, int | None]]:
    """Per (B, D, P) with D > 0: the repetitions' penalties, the median decode step, the first repetition's chunks."""
    out = {}
    for path in sorted(run.glob("[0-9]*/D*_P*.json")):
        rec = json.loads(path.read_text())
        c = rec["config"]
        reps = [r for r in rec["reps"] if r.get("derived", {}).get("tpot_penalty_ms") is not None]
        if c["decode_batch_size"] == 0 or not reps:
            continue
        base = statistics.median(r["baseline"]["tpot_p50_ms"] for r in reps)
        out[(c["chunk_size"], c["decode_batch_size"], c["new_prefill_tokens"])] = (
            [r["derived"]["tpot_penalty_ms"] for r in reps], base, reps[0]["interference"].get("num_chunks_actual"))
    if not out:
        raise SystemExit(f"{run}: no repetitions of a D > 0 configuration under {{chunk}}/D*_P*.json")
    return out


def drift(start: Path, end: Path) -> tuple[int, int, float, float] | None:
    """(configurations, repetitions per configuration in the first run, median drift of the median, of the mean)."""
    a, b = cells(start), cells(end)
    med, mean, reps = [], [], 0
    for key in sorted(a.keys() & b.keys()):
        pa, base, chunks = a[key]
        pb = b[key][0]
        if not ONE_CHUNK[0] <= key[2] <= ONE_CHUNK[1] or chunks != 1 or statistics.median(pa) < NEAR_ZERO * base:
            continue
        med.append(abs(statistics.median(pb) / statistics.median(pa) - 1))
        mean.append(abs(statistics.fmean(pb) / statistics.fmean(pa) - 1))
        reps = len(pa)
    if not med:
        return None
    return len(med), reps, statistics.median(med), statistics.median(mean)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("runs", nargs="+", type=Path, help="pairs: START END [START END ...]")
    ap.add_argument("--out", type=Path)
    a = ap.parse_args(argv)
    if len(a.runs) % 2:
        ap.error(f"{len(a.runs)} directories: give them in pairs (START END)")
    lines = ["# One-chunk eager penalties between two runs: the median and the mean of the repetitions", "",
             "`python scripts/mean_vs_median.py` (its docstring). |end / start - 1|, median over the configurations.",
             "", "| start | end | configurations | repetitions | median moved | mean moved |",
             "|---|---|---|---|---|---|"]
    for start, end in zip(a.runs[::2], a.runs[1::2]):
        got = drift(start, end)
        if got is None:
            lines.append(f"| {start.name} | {end.name} | 0 | | | |")
            continue
        n, reps, med, mean = got
        lines.append(f"| {start.name} | {end.name} | {n} | {reps} | {med:.1%} | {mean:.1%} |")
    text = "\n".join(lines)
    if a.out:
        atomic_write_text(a.out, text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
