"""How far the same configurations moved between two runs of one campaign (a grid measured again at its end).

    python scripts/repeat_drift.py START_DIR END_DIR [--out drift.md]

Reads both directories' `interference_table.csv` (`export-table`), joins the configurations both measured and
prints, per quantity, the mean, median and largest |end / start - 1| and the per-configuration figures of the
two quantities the cost model prices (penalty, aggregate interference). Pure arithmetic on committed tables: the
noise floor against which a model's error on that campaign reads (a model cannot be closer to a configuration
than the same engine measured again minutes later).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pandas as pd

KEY = ["chunk_size", "decode_batch_size", "new_prefill_tokens"]
QUANTITIES = ("tpot_baseline_ms", "tpot_penalty_ms", "prefill_duration_ms", "aggregate_interference_ms")


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
