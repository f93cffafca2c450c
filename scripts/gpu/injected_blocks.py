"""A spread run's injected table, some of its blocks only (GPU session 27): a copy of the injected directory whose
records keep the repetitions of the named blocks, re-aggregated, for `passive_compare.py --injected`.

The 1 req/s spread run (`../../results/h100-vllm0.22-qwen3-coder-30b-a3b-passive-spread-1rps/`) ran its blocks 2
and 4 beside busy loops (`BURN_BLOCKS`), which slow the launch-bound cells by ~20 %
(`../../results/h100-vllm0.22-host-burner/`). Its quiet blocks (1, 3 and 5) are the like-for-like reference for
the passive events, 98 % of which ran on a quiet host.

    python3 scripts/gpu/injected_blocks.py INJECTED_DIR OUT_DIR --blocks 1 3 5

Blocks are numbered from 1, as `spread.tsv` and `spread.md` number them (a repetition's `block` field is k - 1).
OUT_DIR must not exist. Exit 2, one line, where a record keeps none of the named blocks or OUT_DIR exists.
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from pdexporter.errors import PdexporterError  # noqa: E402
from pdexporter.measure.records import aggregate  # noqa: E402
from pdexporter.measure.store import ResultsStore, load_record_file  # noqa: E402


def keep_blocks(source: Path, dest: Path, blocks: set[int]) -> int:
    """Copy `source` to `dest` with every record re-aggregated from the repetitions of `blocks` (from 1);
    the repetitions kept."""
    if dest.exists():
        raise SystemExit(f"{dest}: exists (give a new directory)")
    shutil.copytree(source, dest)
    store = ResultsStore(dest)
    kept = 0
    for path in list(store.iter_record_paths()):
        record = load_record_file(path)
        reps = [r for r in record.reps if (r.model_extra or {}).get("block") is not None
                and int((r.model_extra or {})["block"]) + 1 in blocks]
        if not reps:
            raise SystemExit(f"{path}: no repetition of blocks {sorted(blocks)}")
        store.save_record(aggregate(record.config, reps))
        kept += len(reps)
    return kept


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("injected", type=Path)
    parser.add_argument("out", type=Path)
    parser.add_argument("--blocks", type=int, nargs="+", required=True)
    args = parser.parse_args()
    try:
        kept = keep_blocks(args.injected, args.out, set(args.blocks))
    except (SystemExit, PdexporterError) as exc:
        print(exc)
        return 2
    print(f"{args.out}: {kept} repetitions of blocks {sorted(set(args.blocks))}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
