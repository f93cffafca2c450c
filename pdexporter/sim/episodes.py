"""The slow-host episodes in time (`sim serve --host-speed switching`): when the engine's launch-bound CPU work runs at
the profile's slow level. Pure: a seeded, lazily drawn alternation.

Measured on vLLM (GPU session 37, `results/h100-vllm0.22-llama-3.2-3b-instruct-levels/RUN.md`): the engine's one-chunk
eager steps are slow together for seconds (block to block, ~1.7 s apart, r ~0.5) and a minute's slow share moves
26–77 %. Here each episode lasts an exponential time, `dwell_s` on average for a slow one and
`dwell_s × (1 − share) / share` for a nominal one, so over a long run `share` of the time is slow and a minute's share
scatters as the measured one does. What the model leaves out: the big eager step ran *faster* in the slow seconds
there (r = −0.82 per block); here every CPU cost of a step is slower, as `Profile.on_slow_host` says.
"""

from __future__ import annotations

import bisect
import random

__all__ = ["DWELL_S", "HostEpisodes"]

DWELL_S = 2.5  # a slow episode's mean length: block-to-block r ~0.5 at ~1.7 s apart (GPU session 37)


class HostEpisodes:
    """Whether the host is in a slow episode at time `t` (seconds on the engine's clock, from 0)."""

    def __init__(self, share: float, dwell_s: float = DWELL_S, seed: int = 0) -> None:
        if not 0.0 < share < 1.0:
            raise ValueError(f"slow share {share}: between 0 and 1 (exclusive)")
        if dwell_s <= 0:
            raise ValueError(f"dwell {dwell_s} s: positive")
        self.share, self.dwell_s = share, dwell_s
        self._rng = random.Random(seed)
        self._first_slow = self._rng.random() < share
        self._ends = [0.0]  # the ends of the episodes drawn so far: episode i (i >= 1) ends at _ends[i]

    def _mean(self, slow: bool) -> float:
        return self.dwell_s if slow else self.dwell_s * (1.0 - self.share) / self.share

    def _slow(self, i: int) -> bool:
        """Episode i's state: the first (i = 1) slow with probability `share`, then alternating."""
        return (i % 2 == 1) == self._first_slow

    def slow_at(self, t: float) -> bool:
        while self._ends[-1] <= t:
            i = len(self._ends)
            self._ends.append(self._ends[-1] + self._rng.expovariate(1.0 / self._mean(self._slow(i))))
        return self._slow(bisect.bisect_right(self._ends, t))
