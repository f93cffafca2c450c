"""Quiet against busy host, block by block (GPU session 26, `../../results/h100-vllm0.22-host-burner/`):
one engine, the same launch-bound point measured in alternating blocks, `bK-quiet` with nothing else
running and `bK-burn` beside busy loops at nice 19 on 12 of the 16 CPUs (no request, no decode added:
the cell's D is unchanged). Prints, per model folder and cell, each block's penalty (median of its
repetitions) and the pooled quiet and busy repetitions with a one-sided Mann-Whitney U test each way.

    python3 scripts/gpu/burner_ab.py RESULTS_DIR [--out SUMMARY.md]

RESULTS_DIR holds one folder per engine (e.g. `qwen3-coder-30b-a3b-b8192/`), each with the blocks'
`pdexporter measure --out` folders named `b<k>-quiet` or `b<k>-burn`. Exit 2, one line, where a block
folder holds no record.
"""

from __future__ import annotations

import argparse
import re
import statistics
import sys
from collections import defaultdict
from pathlib import Path

from scipy.stats import mannwhitneyu

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from pdexporter.measure.store import ResultsStore  # noqa: E402

BLOCK = re.compile(r"^b(\d+)-(quiet|burn)$")


def blocks(engine_dir: Path) -> dict[tuple[int, int, int], list[tuple[int, str, list[float]]]]:
    """Per cell (B, D, P): its blocks in order, (k, condition, the repetitions' penalties in ms)."""
    out: dict[tuple[int, int, int], list[tuple[int, str, list[float]]]] = defaultdict(list)
    for folder in sorted(engine_dir.iterdir(), key=lambda p: p.name):
        m = BLOCK.match(folder.name)
        if not m or not folder.is_dir():
            continue
        records = list(ResultsStore(folder).iter_records())
        if not records:
            raise SystemExit(f"{folder}: no measure record (expected `pdexporter measure --out` there)")
        for r in records:
            c = r.config
            pen = [rep.derived.tpot_penalty_ms for rep in r.reps if rep.derived.tpot_penalty_ms is not None]
            out[(c.chunk_size, c.decode_batch_size, c.new_prefill_tokens)].append((int(m[1]), m[2], pen))
    for v in out.values():
        v.sort()
    return out


def summary(root: Path) -> str:
    lines = ["| engine | cell | block: penalty ms (median of its repetitions) | quiet: reps, median | busy: reps, "
             "median | busy / quiet | p (busy slower) | p (quiet slower) |",
             "|---|---|---|---|---|---|---|---|"]
    for engine_dir in sorted(p for p in root.iterdir() if p.is_dir()):
        for (b, d, p), seq in sorted(blocks(engine_dir).items()):
            quiet = [x for _, cond, pen in seq if cond == "quiet" for x in pen]
            busy = [x for _, cond, pen in seq if cond == "burn" for x in pen]
            per_block = " ".join(f"{k}{'q' if cond == 'quiet' else 'B'} {statistics.median(pen):.1f}"
                                 for k, cond, pen in seq if pen)
            if not quiet or not busy:
                continue
            mq, mb = statistics.median(quiet), statistics.median(busy)
            slower = mannwhitneyu(busy, quiet, alternative="greater").pvalue
            faster = mannwhitneyu(quiet, busy, alternative="greater").pvalue
            lines.append(f"| {engine_dir.name} | B={b} D={d} P={p} | {per_block} | {len(quiet)}, {mq:.1f} | "
                         f"{len(busy)}, {mb:.1f} | {mb / mq:.2f} | {slower:.2g} | {faster:.2g} |")
    lines += ["", "q: a quiet block, B: a block beside the busy loops. p: one-sided Mann-Whitney U on the pooled "
              "repetitions."]
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("root", type=Path)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    if not args.root.is_dir():
        print(f"{args.root}: not a folder")
        return 2
    try:
        text = summary(args.root)
    except SystemExit as exc:
        print(exc)
        return 2
    if args.out:
        args.out.write_text(text + "\n", encoding="utf-8")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
