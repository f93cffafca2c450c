"""Two conditions, block by block, on the same launch-bound cells: `bK-<condition>` folders of `pdexporter measure
--out`, the conditions alternating. Block 1's condition is the reference. Prints, per engine folder and cell, each
block's penalty (median of its repetitions) and the pooled repetitions of each condition, with a one-sided
Mann-Whitney U test each way.

- GPU session 26 (`../../results/h100-vllm0.22-host-burner/`): `quiet` (nothing else running) against `burn`
  (busy loops at nice 19 on 12 of the 16 CPUs; no request and no decode added, so the cell's D is unchanged).
- `engine-ab.sh`: one engine flag set against another (`a` / `b`), an engine started per block.

    python3 scripts/gpu/block_ab.py RESULTS_DIR [--out SUMMARY.md]

RESULTS_DIR holds one folder per engine (e.g. `qwen3-coder-30b-a3b-b8192/`) with the blocks' folders. Exit 2, one
line, where a block folder holds no record or an engine folder does not hold exactly two conditions.
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

BLOCK = re.compile(r"^b(\d+)-([a-z][a-z0-9_]*)$")


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


def conditions(engine_dir: Path, seq: list[tuple[int, str, list[float]]]) -> tuple[str, str]:
    """The reference (block 1's condition) and the other one; exactly two."""
    names = list(dict.fromkeys(cond for _, cond, _ in seq))
    if len(names) != 2:
        raise SystemExit(f"{engine_dir}: {len(names)} conditions ({', '.join(names) or 'none'}), expected two")
    return names[0], names[1]


def _cv(values: list[float]) -> str:
    return f"{statistics.stdev(values) / statistics.fmean(values):.0%}" if len(values) > 1 else "-"


def summary(root: Path) -> str:
    lines: list[str] = []
    legend: dict[str, str] = {}
    for engine_dir in sorted(p for p in root.iterdir() if p.is_dir()):
        for (b, d, p), seq in sorted(blocks(engine_dir).items()):
            ref, other = conditions(engine_dir, seq)
            short = {ref: ref[0].lower(), other: other[0].upper()}
            legend |= {short[ref]: ref, short[other]: other}
            if not lines:
                lines = [f"| engine | cell | block: penalty ms (median of its repetitions) | {ref}: reps, median, CV | "
                         f"{other}: reps, median, CV | {other} / {ref} | p ({other} slower) | p ({ref} slower) |",
                         "|---|---|---|---|---|---|---|---|"]
            first = [x for _, cond, pen in seq if cond == ref for x in pen]
            second = [x for _, cond, pen in seq if cond == other for x in pen]
            per_block = " ".join(f"{k}{short[cond]} {statistics.median(pen):.1f}" for k, cond, pen in seq if pen)
            if not first or not second:
                continue
            m1, m2 = statistics.median(first), statistics.median(second)
            slower = mannwhitneyu(second, first, alternative="greater").pvalue
            faster = mannwhitneyu(first, second, alternative="greater").pvalue
            lines.append(f"| {engine_dir.name} | B={b} D={d} P={p} | {per_block} | "
                         f"{len(first)}, {m1:.1f}, {_cv(first)} | {len(second)}, {m2:.1f}, {_cv(second)} | "
                         f"{m2 / m1:.2f} | {slower:.2g} | {faster:.2g} |")
    lines += ["", ", ".join(f"{k}: a block of `{v}`" for k, v in legend.items())
              + ". CV: the pooled repetitions' (two launch levels show as a large one). p: one-sided Mann-Whitney U on "
              "the pooled repetitions."]
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
