"""A passive run against injection on the same engine (issue 23): the command line of
`pdexporter.analysis.passive_compare.compare_passive` (its docs say what it compares and writes).
Run by scripts/gpu/passive-h200.sh and scripts/results.sh; prints the markdown; exit 2 without
passive events.

    python3 scripts/gpu/passive_compare.py PASSIVE_DIR --injected INJECTED_DIR [--reference DIR]
        [--out DIR] [--minutes 1 2 5 10 30] [--bootstrap 200] [--launch-level mixed|slow|fast]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from pdexporter.analysis.passive_compare import compare_passive  # noqa: E402
from pdexporter.analysis.passive_model import CONVERGENCE_MINUTES, LAUNCH_LEVELS  # noqa: E402

parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
parser.add_argument("passive_dir", type=Path)
parser.add_argument("--injected", type=Path, required=True)
parser.add_argument("--reference", type=Path, default=None)
parser.add_argument("--out", type=Path, default=Path("."))
parser.add_argument("--minutes", type=float, nargs="+", default=list(CONVERGENCE_MINUTES))
parser.add_argument("--bootstrap", type=int, default=200)
parser.add_argument("--launch-level", choices=LAUNCH_LEVELS, default="mixed",
                    help="the event model's launch-bound one-chunk events: all (mixed), or those of one launch "
                         "level (pdexporter.analysis.passive_model, 'Launch levels')")
args = parser.parse_args()
text = compare_passive(args.passive_dir, args.injected, reference=args.reference, out=args.out,
                       minutes=args.minutes, bootstrap=args.bootstrap, launch_level=args.launch_level)
if text is None:
    sys.exit(2)
print(text)
