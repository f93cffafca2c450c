"""What a sweep still has to do, decided from the records on disk. Pure: data in, data out.

Repetitions of a configuration come in *attempts* of `reps` each. After an attempt, the CV of
its penalties (the seed's reproducibility criterion) is compared with the threshold; above it,
another attempt runs, up to `max_reruns` times. Every repetition stays in the record's `reps`
(nothing measured is thrown away, and a rerun resumes by counting them); the record's top-level
numbers are the medians of the *last* attempt, and `summary` says which repetitions those are,
the CV of every attempt, and whether the configuration is still flagged.

A configuration is complete when its last complete attempt passed the threshold, or when the
re-runs are used up (then `summary.flagged` is true). A partial attempt is always completed.
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from pdexporter.measure.records import RecordConfig, RepRecord, RunRecord, Summary, aggregate, counted_reps, cv
from pdexporter.sweep.spec import CvSpec

__all__ = [
    "ConfigStatus", "RunTimes", "attempt_cv", "block_order", "config_status", "cv_metric_name", "median",
    "split_attempts", "summarise_attempts",
]


def _metric(rep: RepRecord) -> float | None:
    """The CV's quantity: the penalty; at D = 0 (no penalty exists) the prefill duration."""
    if rep.derived.tpot_penalty_ms is not None:
        return rep.derived.tpot_penalty_ms
    return rep.interference.prefill_duration_ms


def cv_metric_name(reps: Sequence[RepRecord]) -> str:
    return "tpot_penalty_ms" if any(r.derived.tpot_penalty_ms is not None for r in reps) else "prefill_duration_ms"


def attempt_cv(reps: Sequence[RepRecord]) -> float | None:
    """The CV of an attempt's counted repetitions (`RepRecord.counted`)."""
    return cv([_metric(r) for r in counted_reps(reps)])


def split_attempts(reps: Sequence[RepRecord], per_attempt: int) -> list[list[RepRecord]]:
    ordered = sorted(reps, key=lambda r: r.rep)
    return [ordered[i : i + per_attempt] for i in range(0, len(ordered), per_attempt)]


@dataclass(frozen=True)
class ConfigStatus:
    reps_recorded: int
    complete_attempts: int
    cv_by_attempt: tuple[float | None, ...]
    target_reps: int | None  # repetitions the record must hold after the next step; None: complete
    flagged: bool  # the last complete attempt is still above the threshold

    @property
    def complete(self) -> bool:
        return self.target_reps is None

    @property
    def reps_to_run(self) -> int:
        return 0 if self.target_reps is None else self.target_reps - self.reps_recorded


def config_status(reps: Sequence[RepRecord], per_attempt: int, cv_spec: CvSpec) -> ConfigStatus:
    attempts = split_attempts(reps, per_attempt)
    complete = [a for a in attempts if len(a) == per_attempt]
    cvs = tuple(attempt_cv(a) for a in complete)
    above = bool(cvs) and cvs[-1] is not None and cvs[-1] > cv_spec.threshold
    n = len(reps)
    if len(attempts) > len(complete) or not complete:
        target: int | None = (len(complete) + 1) * per_attempt
    elif above and len(complete) - 1 < cv_spec.max_reruns:
        target = (len(complete) + 1) * per_attempt
    else:
        target = None
    return ConfigStatus(n, len(complete), cvs, target, above and target is None)


def summarise_attempts(config: RecordConfig, reps: list[RepRecord], per_attempt: int, cv_spec: CvSpec) -> RunRecord:
    """The record: medians of the last attempt, every repetition kept, attempts described."""
    attempts = split_attempts(reps, per_attempt)
    last = attempts[-1]
    record = aggregate(config.model_copy(update={"reps_planned": per_attempt}), last)
    status = config_status(reps, per_attempt, cv_spec)
    record.reps = sorted(reps, key=lambda r: r.rep)
    assert record.summary is not None
    record.summary = Summary.model_validate(
        {
            **record.summary.model_dump(),
            "aggregation": "median over the repetitions of the last attempt",
            "aggregated_reps": [r.rep for r in last],
            "reps_recorded": len(reps),
            "attempts": len(attempts),
            "cv_metric": cv_metric_name(reps),
            "cv_threshold": cv_spec.threshold,
            "cv_by_attempt": [None if c is None else round(c, 4) for c in status.cv_by_attempt],
            "rerun": len(attempts) > 1,
            "flagged": status.flagged,
        }
    )
    return record


# ---------------------------------------------------------------------------------------------
# Interleaved order


def block_order(seed: int, chunk_size: int, block: int, points: Sequence[tuple[int, int]]) -> list[tuple[int, int]]:
    """Block `block` of an interleaved sweep at one chunk size: every (D, P) of `points` once, the
    D values in a random order and the P values of each D in a random order.

    The order depends on (seed, chunk size, block) and the grid's points only, so a sweep resumed
    mid-block runs the rest of that block in the same order. A D value's configurations stay
    together because they share a probe set (fast mode) and their Phase 1: one set per D per block
    instead of one per configuration, so interleaving costs ~0.3 s per D and block, not per
    repetition. Blocks last tens of seconds (49 configurations x ~0.5 s on an H200), the scale of
    the host-speed levels a blocked order hands to one configuration's repetitions."""
    rng = random.Random(f"pdexporter-order:{seed}:{chunk_size}:{block}")
    by_d: dict[int, list[int]] = {}
    for d, p in points:
        by_d.setdefault(d, []).append(p)
    order: list[tuple[int, int]] = []
    ds = list(by_d)
    rng.shuffle(ds)
    for d in ds:
        ps = list(by_d[d])
        rng.shuffle(ps)
        order += [(d, p) for p in ps]
    return order


# ---------------------------------------------------------------------------------------------
# How long the next step may take (for --deadline)

_DEFAULTS_S = {"engine_start": 120.0, "warmup": 30.0, "phase1": 20.0, "rep": 15.0, "drain": 5.0}


@dataclass
class RunTimes:
    """Durations seen so far; estimates err long (1.5x the longest comparable one)."""

    safety: float = 1.5
    seen: dict[str, dict[tuple[int, ...], float]] = field(default_factory=dict)

    def observe(self, kind: str, key: tuple[int, ...], seconds: float) -> None:
        table = self.seen.setdefault(kind, {})
        table[key] = max(seconds, table.get(key, 0.0))

    def estimate(self, kind: str, key: tuple[int, ...]) -> float:
        table = self.seen.get(kind, {})
        if key in table:
            return self.safety * table[key]
        same_chunk = [v for k, v in table.items() if k[:1] == key[:1]]
        if kind == "rep" and len(key) == 3:
            same_p = [v for k, v in table.items() if k[0] == key[0] and k[2] == key[2]]
            if same_p:
                return self.safety * max(same_p)
            # A larger P than any seen in this chunk: scale the longest by the prefill size.
            sized = [(k[2], v) for k, v in table.items() if k[0] == key[0]]
            if sized:
                p_seen, longest = max(sized, key=lambda kv: kv[1])
                return self.safety * longest * max(1.0, key[2] / p_seen)
        pool = same_chunk or list(table.values())
        return self.safety * max(pool) if pool else _DEFAULTS_S.get(kind, 30.0)


def median(values: Iterable[float | None]) -> float | None:
    present = sorted(v for v in values if v is not None)
    if not present:
        return None
    mid = len(present) // 2
    return present[mid] if len(present) % 2 else (present[mid - 1] + present[mid]) / 2
