"""How far the same configurations moved between two runs of one campaign (a grid measured again at its end).

    python scripts/repeat_drift.py START_DIR END_DIR [--out drift.md]

Reads both directories' `interference_table.csv` (`export-table`), joins the configurations both measured and
prints, per quantity, the mean, median and largest |end / start - 1|; the penalty and the aggregate by prompt
length over the configurations whose penalty both runs resolve (at least `cv_causes.NEAR_ZERO` of the decode step:
P < 512 a graph-sized prompt, 512-2048 one chunk that runs eager on vLLM's default flags, above 2048 a big chunk or
several); and the per-configuration figures of the two quantities the cost model prices (penalty, aggregate
interference). Pure arithmetic on committed tables: the
noise floor against which a model's error on that campaign reads (a model cannot be closer to a configuration
than the same engine measured again minutes later).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from pdexporter.analysis.cv_causes import NEAR_ZERO  # noqa: E402

KEY = ["chunk_size", "decode_batch_size", "new_prefill_tokens"]
QUANTITIES = ("tpot_baseline_ms", "tpot_penalty_ms", "prefill_duration_ms", "aggregate_interference_ms")
PROMPTS = (("P < 512", 0, 511), ("P 512-2048", 512, 2048), ("P > 2048", 2049, None))


def _by_prompt(m: pd.DataFrame) -> list[str]:
    """Median and mean |end / start - 1| of the penalty and the aggregate, the resolved configurations by P."""
    resolved = m[(m.decode_batch_size > 0)
                 & (m.tpot_penalty_ms_start >= NEAR_ZERO * m.tpot_baseline_ms_start)
                 & (m.tpot_penalty_ms_end >= NEAR_ZERO * m.tpot_baseline_ms_end)]
    lines = ["", f"Resolved in both runs (penalty >= {NEAR_ZERO:.0%} of the decode step), by prompt length: "
             "|end / start - 1|, median (mean)", "",
             "| prompts | n | penalty | aggregate |", "|---|---|---|---|"]
    for label, lo, hi in PROMPTS:
        g = resolved[(resolved.new_prefill_tokens >= lo)
                     & ((resolved.new_prefill_tokens <= hi) if hi is not None else True)]
        if g.empty:
            continue
        cells = [(g[f"{q}_end"] / g[f"{q}_start"] - 1).abs() for q in ("tpot_penalty_ms", "aggregate_interference_ms")]
        lines.append(f"| {label} | {len(g)} | " + " | ".join(
            f"{100 * c.median():.1f} % ({100 * c.mean():.1f} %)" for c in cells) + " |")
    return lines


def drift(start: Path, end: Path) -> str:
    tables = []
    for d in (start, end):
        path = d / "interference_table.csv"
        if not path.is_file():
            raise SystemExit(f"{path}: no such file (run export-table on {d} first)")
        tables.append(pd.read_csv(path))
    m = tables[0].merge(tables[1], on=KEY, suffixes=("_start", "_end"))
    if m.empty:
        raise SystemExit(f"{start} and {end} share no configuration")
    lines = [f"# The same configurations measured twice: `{start}` then `{end}`", "",
             f"{len(m)} configurations in both. |end / start - 1| per quantity:", "",
             "| quantity | n | mean | median | max |", "|---|---|---|---|---|"]
    for q in QUANTITIES:
        rel = (m[f"{q}_end"] / m[f"{q}_start"] - 1).abs().dropna()
        if len(rel):
            lines.append(f"| {q} | {len(rel)} | {100 * rel.mean():.1f} % | {100 * rel.median():.1f} % "
                         f"| {100 * rel.max():.1f} % |")
    lines += _by_prompt(m)
    lines += ["", "| B | D | P | penalty start | end | aggregate start | end |", "|---|---|---|---|---|---|---|"]
    for _, r in m[m.decode_batch_size > 0].iterrows():
        lines.append(f"| {r.chunk_size} | {r.decode_batch_size} | {r.new_prefill_tokens} "
                     f"| {r.tpot_penalty_ms_start:.2f} | {r.tpot_penalty_ms_end:.2f} "
                     f"| {r.aggregate_interference_ms_start:.2f} | {r.aggregate_interference_ms_end:.2f} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("start", type=Path)
    ap.add_argument("end", type=Path)
    ap.add_argument("--out", type=Path, help="write the markdown here (default: stdout)")
    args = ap.parse_args(argv)
    text = drift(args.start, args.end)
    if args.out:
        args.out.write_text(text)
    else:
        sys.stdout.write(text)


if __name__ == "__main__":
    main(sys.argv[1:])
