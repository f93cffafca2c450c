"""`--quick`: a benchmark in seconds, its code paths all run on small settings, for CI.

Every `bench_*.py` here takes `--quick` (tests/integration/test_benchmarks_quick.py runs each one so
and checks that it ends well and prints figures): a benchmark that no test runs breaks unseen when
the code it drives is renamed. The figures of a quick run are not the benchmark's: too few to mean
anything, and its targets are not judged (`args.quick` tells a script not to). Options given on the
command line still win over the quick settings.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import Any


def parse_args(parser: argparse.ArgumentParser, argv: Sequence[str] | None = None, **quick: Any) -> argparse.Namespace:
    """`parser`'s arguments, with `--quick` added: it makes `quick` (dest=value) the defaults."""
    shown = ", ".join(f"{k}={v}" for k, v in quick.items())
    parser.add_argument("--quick", action="store_true",
                        help=f"seconds, for CI: {shown or 'the defaults'}; figures too few to mean anything, "
                             "targets not judged")
    args = parser.parse_args(argv)
    if args.quick and quick:
        parser.set_defaults(**quick)
        args = parser.parse_args(argv)
    return args
