"""Bootstrap confidence intervals for a grid point's medians over repetitions. Pure.

The table's values are medians over a handful of repetitions (the seed's five). How far such a
median may be from the configuration's own is what a percentile bootstrap says without assuming
a distribution: resample the repetitions with replacement `resamples` times, take the median of
each resample, and report the (1 - level)/2 and (1 + level)/2 quantiles of those medians.

The draws are seeded from the grid point itself (`point_seed`), so a row's interval is the same
whatever else is in the table and in whichever order the rows come. With n repetitions a median
can take only a few values, so with n = 5 the 95 % interval usually runs from about the second
smallest to the second largest repetition; with fewer than two there is no interval (None).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

__all__ = [
    "LEVEL", "RESAMPLES", "SEED", "bootstrap_ci", "point_seed",
]

LEVEL = 0.95
RESAMPLES = 2000
SEED = 20240  # the table's bootstrap seed; a point's own draws derive from it and its key


def point_seed(key: Sequence[int], column: str, seed: int = SEED) -> list[int]:
    """The seed of one point's draws for one column: the table's seed, the key, the column's bytes."""
    return [seed, *(int(k) for k in key), *column.encode("utf-8")]


def bootstrap_ci(
    values: Sequence[float | int | None],
    *,
    seed: Sequence[int] | int = SEED,
    level: float = LEVEL,
    resamples: int = RESAMPLES,
) -> tuple[float | None, float | None]:
    """Percentile bootstrap interval of the median of `values` (None and NaN left out)."""
    present = np.array([float(v) for v in values if v is not None and not math.isnan(float(v))])
    if len(present) < 2:
        return None, None
    rng = np.random.default_rng(list(seed) if not isinstance(seed, int) else seed)
    draws = rng.integers(0, len(present), size=(resamples, len(present)))
    medians = np.median(present[draws], axis=1)
    low, high = np.quantile(medians, [(1 - level) / 2, (1 + level) / 2])
    return float(low), float(high)
