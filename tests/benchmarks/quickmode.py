"""`--quick`: a benchmark in seconds, its code paths all run on small settings, for CI.

Every `bench_*.py` here takes `--quick` (tests/integration/test_benchmarks_quick.py runs each one so
and checks that it ends well and prints figures): a benchmark that no test runs breaks unseen when
the code it drives is renamed. The figures of a quick run are not the benchmark's: too few to mean
anything, and its targets are not judged (`args.quick` tells a script not to). Options given on the
command line still win over the quick settings. `best_of` is the benchmarks' timing loop.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

T = TypeVar("T")


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


def best_of(repeat: int, work: Callable[[], T]) -> tuple[float, float, T]:
    """`work()` run `repeat` times (at least once): (the best wall seconds, the best CPU seconds, its last result)."""
    best_wall = best_cpu = float("inf")
    result: Any = None
    for _ in range(max(1, repeat)):
        w0, c0 = time.perf_counter(), time.process_time()
        result = work()
        best_wall = min(best_wall, time.perf_counter() - w0)
        best_cpu = min(best_cpu, time.process_time() - c0)
    return best_wall, best_cpu, result
