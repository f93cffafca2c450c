"""Why a configuration's repetitions disagree (criterion 4, issue 32): each CV exception explained
from its own repetitions, the penalty beside the engine's chunk steps (the step log's times, the
same repetitions).

The TPOT penalty is the chunk steps' token-weighted mean minus the decode step, so when the
repetitions' penalties spread, either the engine's chunk steps spread with them (the GPU or the
host ran the same work at another speed) or they did not (the client's reading of the window
moved). The causes, in the order they are tried:

- `near-zero penalty`: the penalty's mean is under a fifth of the decode step (the offloaded arm's
  DecodeBench losses of a few ms, a CUDA-graph step): its CV divides the step's own jitter by
  almost nothing.
- `no step log`: the records carry no chunk step times (an engine without an iteration log, or
  one not read): nothing to tell the two apart.
- `first-shape JIT`: one repetition's chunk steps took over 5 x the others' median and 200 ms more (the first
  occurrence of a batch shape after a start compiles kernels: ~1.3 s on an H200); a warm-up that
  ran that shape first removes it.
- `split across intervals`: the chunk steps spread as much as the penalty, but what the decodes lost
  in all (the repetitions' aggregate interference) held, under a third of the penalty's CV: the same
  work fell partly into the decode interval before or after the chunk step, by when the request
  arrived in the engine's asynchronous loop (vLLM 0.22, Qwen2.5-32B at B = 3072, D = 4, P = 1024:
  chunk-step intervals 69 / 100 / 100 ms beside 56 / 27 / 26 ms before them, summing to 106-108 ms;
  the engine log's step time moves with them, 64 / 97 / 97 ms). The penalty reads the chunk's
  interval alone, so it moves; the totals do not.
- `engine step levels`: the chunk steps' excess over the decode step spread as much as the
  penalty (>= 0.7 x its CV). Where the repetitions fall into two groups (the slower's median >=
  1.3 x the faster's), it says which and how many: on the H200 a launch-bound single eager chunk
  runs at ~45-50 or ~75-90 ms (docs/analysis.md, "Held-out campaigns"). The level is the engine's
  own state, held for seconds, whose share of a minute moves (GPU session 37: 150 interleaved
  repetitions on one H100 kept a CV of 31-39 %, results/h100-vllm0.22-llama-3.2-3b-instruct-levels/
  RUN.md). More repetitions average two levels; they do not remove them.
- `engine step split`: the chunk steps' sum held but the longest step moved (the same work split
  differently between steps, e.g. a 4095-token chunk and a 1-token tail once as ~46 + ~26 ms and
  once as ~74 + ~2 ms), which moves the token-weighted mean the penalty is.
- `client or window`: the engine's chunk steps held while the penalty moved.

Pure: takes the analysis's `ConfigSamples`, returns data.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from pdexporter.analysis.table import ConfigSamples
from pdexporter.measure.records import cv as records_cv

__all__ = ["CvException", "explain", "explain_all"]

JIT_FACTOR = 5.0  # a repetition's chunk-step excess this many times the others' median: a first-shape JIT
JIT_MIN_MS = 200.0  # ... and this much longer (a kernel compiled in the step: ~1.3 s on an H200)
NEAR_ZERO = 0.2  # a penalty whose mean is under this share of the decode step: its CV is the step's jitter
SHARE = 0.7  # the steps' CV at least this share of the penalty's: the engine's steps moved
SPLIT = 1 / 3  # the aggregate's CV under this share of the penalty's, with the steps spread: the work was split
LEVELS = 1.3  # two groups of repetitions whose step medians differ by this factor: two levels


@dataclass(frozen=True)
class CvException:
    key: tuple[int, int, int]  # (B, D, P)
    cv: float  # of the TPOT penalty over the repetitions
    cause: str  # near-zero penalty | no step log | first-shape JIT | split across intervals | engine step levels
    #             | engine step split
    #             | client or window
    detail: str

    def to_dict(self) -> dict[str, Any]:
        b, d, p = self.key
        return {"chunk_size": b, "decode_batch_size": d, "new_prefill_tokens": p, "cv": round(self.cv, 4),
                "cause": self.cause, "detail": self.detail}


def _cv(values: Sequence[float]) -> float | None:
    """The CV the table and criterion 4 use (`measure.records.cv`)."""
    return records_cv(list(values))


def _two_levels(excess: Sequence[float]) -> str | None:
    """'k at ~A ms, n-k at ~B ms' where the repetitions split at their widest gap into two groups
    whose medians differ by LEVELS, else None."""
    ordered = sorted(excess)
    gaps = [(ordered[i + 1] - ordered[i], i) for i in range(len(ordered) - 1)]
    if not gaps:
        return None
    _, at = max(gaps)
    low, high = ordered[: at + 1], ordered[at + 1 :]
    lo, hi = statistics.median(low), statistics.median(high)
    if lo <= 0 or hi / lo < LEVELS:
        return None
    return f"{len(low)} at ~{lo:.0f} ms, {len(high)} at ~{hi:.0f} ms of chunk-step excess"


def explain(sample: ConfigSamples, cv: float) -> CvException:
    """The cause of one configuration's spread (module docs)."""
    penalties = [r.get("tpot_penalty_ms") for r in sample.reps]
    mean = statistics.fmean(float(p) for p in penalties if p is not None)
    bases = [float(b) for b in (r.get("tpot_baseline_ms") for r in sample.reps) if isinstance(b, int | float)]
    if bases and abs(mean) < NEAR_ZERO * statistics.median(bases):
        return CvException(sample.key, cv, "near-zero penalty",
                           f"the penalty's mean {mean:.2f} ms is under {NEAR_ZERO:.0%} of the decode step "
                           f"({statistics.median(bases):.2f} ms): its CV measures the step's own jitter")
    own = sample.rep_steps
    if len(own) != len(penalties) or any(s is None for s in own):
        return CvException(sample.key, cv, "no step log", "the records carry no chunk step times for every repetition")
    steps = [sum(s.step_times_ms) - len(s.step_times_ms) * s.baseline_ms for s in own if s is not None]
    if not steps:
        return CvException(sample.key, cv, "no step log", "the records carry no chunk step times for every repetition")
    for i, value in enumerate(steps):
        others = steps[:i] + steps[i + 1 :]
        if others and value > JIT_FACTOR * max(statistics.median(others), 1e-9) and \
                value - statistics.median(others) >= JIT_MIN_MS:
            return CvException(sample.key, cv, "first-shape JIT",
                               f"repetition {i}: chunk steps {value:.0f} ms over the decode step, the others' "
                               f"median {statistics.median(others):.0f} ms")
    step_cv = _cv(steps)
    totals = [r.get("aggregate_interference_ms") for r in sample.reps]
    total_cv = _cv([float(t) for t in totals if t is not None]) if None not in totals else None
    if step_cv is not None and step_cv >= SHARE * cv and total_cv is not None and total_cv < SPLIT * cv:
        return CvException(sample.key, cv, "split across intervals",
                           f"the chunk steps spread (CV {step_cv:.0%}) but the decodes' total loss held (CV "
                           f"{total_cv:.0%}): the same work fell partly into the decode interval beside the chunk "
                           f"step, by when the request arrived; the penalty reads the chunk's interval alone")
    if step_cv is not None and step_cv >= SHARE * cv:
        levels = _two_levels(steps)
        said = f"the engine's chunk steps spread too (CV {step_cv:.0%} against the penalty's {cv:.0%})"
        return CvException(sample.key, cv, "engine step levels", f"{said}: {levels}" if levels else said)
    # the steps' sum held but not how the engine split it (a big chunk and a 1-token tail at one
    # time, one chunk and a tail folded into a decode step at another: the token-weighted mean moves)
    longest = [max(s.step_times_ms) - s.baseline_ms for s in own if s is not None]
    split_cv = _cv(longest)
    if split_cv is not None and split_cv >= SHARE * cv:
        return CvException(sample.key, cv, "engine step split",
                           f"the chunk steps' sum held (CV {0.0 if step_cv is None else step_cv:.0%}) but the "
                           f"longest step moved (CV {split_cv:.0%}; {min(longest):.0f}-{max(longest):.0f} ms over "
                           f"the decode step): the engine split the same work differently between steps")
    return CvException(sample.key, cv, "client or window",
                       f"the engine's chunk steps held (CV {0.0 if step_cv is None else step_cv:.0%}) while the "
                       f"penalty spread ({cv:.0%})")


def explain_all(samples: Sequence[ConfigSamples], threshold: float = 0.15) -> list[CvException]:
    """Every configuration with D >= 1 whose penalty's CV is at or above `threshold`, explained."""
    out = []
    for s in samples:
        if s.decode_batch_size < 1:
            continue
        values = [r.get("tpot_penalty_ms") for r in s.reps]
        cv = _cv([float(v) for v in values if v is not None]) if None not in values else None
        if cv is not None and cv >= threshold:
            out.append(explain(s, cv))
    return sorted(out, key=lambda e: e.key)
