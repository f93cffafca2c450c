"""A passive run against injection on the same engine (issue 23): the command line of
`pdexporter.analysis.passive_compare.compare_passive` (its docs say what it compares and writes).
Run by scripts/gpu/passive-h200.sh and scripts/results.sh; prints the markdown; exit 2 without
passive events.

    python3 scripts/gpu/passive_compare.py PASSIVE_DIR --injected INJECTED_DIR [--reference DIR]
        [--out DIR] [--minutes 1 2 5 10 30] [--bootstrap 200] [--launch-level mixed|slow|fast|matched]
        [--campaign-variation held_out.json] [--spread spread.tsv]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from pdexporter.analysis.campaigns import load_variation  # noqa: E402
from pdexporter.analysis.passive_compare import SCORING_LEVELS, compare_passive, spread_segments  # noqa: E402
from pdexporter.analysis.passive_model import CONVERGENCE_MINUTES  # noqa: E402
from pdexporter.errors import PdexporterError  # noqa: E402

parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
parser.add_argument("passive_dir", type=Path)
parser.add_argument("--injected", type=Path, required=True)
parser.add_argument("--reference", type=Path, default=None)
parser.add_argument("--out", type=Path, default=Path("."))
parser.add_argument("--minutes", type=float, nargs="+", default=list(CONVERGENCE_MINUTES))
parser.add_argument("--bootstrap", type=int, default=200)
parser.add_argument("--launch-level", choices=SCORING_LEVELS, default="mixed",
                    help="the event model's launch-bound one-chunk events: all (mixed), or those of one launch "
                         "level (pdexporter.analysis.passive_model, 'Launch levels'); matched: the mixed fit, "
                         "with a level-matched scoring beside it (each launch-bound injected cell at the level "
                         "its own repetitions' chunk steps show; never the headline figure)")
parser.add_argument("--campaign-variation", type=Path, default=None,
                    help="held_out.json of `pdexporter validate`: the full fits' intervals carry the campaign "
                         "variation it measured (as export-table --campaign-variation makes the passive table's)")
parser.add_argument("--spread", type=Path, default=None,
                    help="a spread run's spread.tsv (passive-h200.sh SEGMENTS=K): minutes of traffic are the "
                         "passive segments' own, the injected blocks between them left out")
args = parser.parse_args()
try:
    variation = load_variation(args.campaign_variation)[0] if args.campaign_variation else None
    spans = spread_segments(args.spread) if args.spread else None
except PdexporterError as exc:
    print(f"passive_compare: {exc}", file=sys.stderr)
    sys.exit(2)
text = compare_passive(args.passive_dir, args.injected, reference=args.reference, out=args.out,
                       minutes=args.minutes, bootstrap=args.bootstrap, launch_level=args.launch_level,
                       variation=variation, traffic_spans=spans)
if text is None:
    sys.exit(2)
print(text)
