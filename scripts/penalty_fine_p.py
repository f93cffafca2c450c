"""The penalty column on a fine P sweep (issue 21): the headline (token-weighted mean of the chunk
steps) beside the token-weighted median it replaced, per P, from an interference_table.csv.

    python scripts/penalty_fine_p.py results/sim-fine-p [--decode-batch-size 10]

Writes DIR/plots/penalty_fine_p.png and prints the two columns with each one's change per 100
tokens (within a chunk count the mean moves with the work; the median jumps between steps)."""

from __future__ import annotations

import argparse
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results", type=Path)
    parser.add_argument("--decode-batch-size", "-D", type=int, default=10)
    args = parser.parse_args()
    table = pd.read_csv(args.results / "interference_table.csv")
    rows = table[table["decode_batch_size"] == args.decode_batch_size].sort_values("new_prefill_tokens")
    if not len(rows):
        raise SystemExit(f"{args.results}: no row with D = {args.decode_batch_size}")
    b = int(rows["chunk_size"].iloc[0])
    print(f"B={b} D={args.decode_batch_size}: P, chunks, penalty (mean), penalty p50 (ms)")
    for r in rows.itertuples():
        print(f"  {r.new_prefill_tokens:>6} {r.num_chunks:>2} {r.tpot_penalty_ms:8.1f} {r.tpot_penalty_p50_ms:8.1f}")
    fig, ax = plt.subplots(figsize=(7, 4))
    for chunks, part in rows.groupby("num_chunks"):
        ax.plot(part["new_prefill_tokens"], part["tpot_penalty_ms"], "o-", color="C0",
                label="tpot_penalty_ms (token-weighted mean)" if chunks == rows["num_chunks"].min() else None)
        ax.plot(part["new_prefill_tokens"], part["tpot_penalty_p50_ms"], "s--", color="C3",
                label="tpot_penalty_p50_ms (token-weighted median)" if chunks == rows["num_chunks"].min() else None)
        ax.annotate(f"{chunks} chunks", (part["new_prefill_tokens"].mean(), part["tpot_penalty_ms"].max()),
                    textcoords="offset points", xytext=(0, 8), ha="center", fontsize=8)
    ax.set_xlabel("new_prefill_tokens (P)")
    ax.set_ylabel("TPOT penalty during the prefill (ms)")
    modelled = " (MODELLED: embedded engine)" if bool(rows["modelled"].any()) else ""
    ax.set_title(f"Penalty on a fine P sweep, B={b}, D={args.decode_batch_size}{modelled}", fontsize=9)
    ax.margins(x=0.04, y=0.12)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8, loc="lower center")
    out = args.results / "plots" / "penalty_fine_p.png"
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110, bbox_inches="tight")
    print(out)


if __name__ == "__main__":
    main()
