"""The load's shape: when requests arrive and how long their prompts and outputs are. Pure.

Arrivals are a Poisson process of rate `rate` (exponential gaps). Each request draws a component
of the mix by weight, then its prompt and output lengths from that component's log-normal
distributions (median and log-space sigma), clipped to the component's bounds.

`SHAREGPT_LIKE` imitates what ShareGPT-style chat traffic is reported to look like (most prompts
a few hundred tokens with a long tail, outputs of a few hundred) and adds the long-document
requests (RAG, code) a P/D decision is about, so every prefill size of the seed's grid
(512 .. 32768 tokens) sees traffic:

    chat       60 %  prompt median   350, sigma 0.9, 16..4096     output median 220, sigma 0.8
    documents  30 %  prompt median  3000, sigma 0.7, 512..16384   output median 180, sigma 0.7
    long       10 %  prompt median 16000, sigma 0.5, 4096..32768  output median 120, sigma 0.6

`DOCUMENTS_HEAVY` is a second mix with the same components weighted towards long prompts (chat
35 %, documents 45 %, long 20 %), for checking that what passive mode learns does not depend on
the mix (issue 30: passive runs "with different seeds and prompt mixes"). `MIXES` names both.

Every prompt is cold (random ids from the request's own seed): what a prefill costs without
prefix-cache hits, the quantity the injected table measures.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class MixComponent:
    name: str
    weight: float
    prompt_median: float
    prompt_sigma: float
    prompt_min: int
    prompt_max: int
    output_median: float
    output_sigma: float
    output_min: int = 1
    output_max: int = 1024


SHAREGPT_LIKE: tuple[MixComponent, ...] = (
    MixComponent("chat", 0.60, 350, 0.9, 16, 4096, 220, 0.8),
    MixComponent("documents", 0.30, 3000, 0.7, 512, 16384, 180, 0.7),
    MixComponent("long", 0.10, 16000, 0.5, 4096, 32768, 120, 0.6),
)


DOCUMENTS_HEAVY: tuple[MixComponent, ...] = (
    MixComponent("chat", 0.35, 350, 0.9, 16, 4096, 220, 0.8),
    MixComponent("documents", 0.45, 3000, 0.7, 512, 16384, 180, 0.7),
    MixComponent("long", 0.20, 16000, 0.5, 4096, 32768, 120, 0.6),
)

MIXES: dict[str, tuple[MixComponent, ...]] = {"sharegpt-like": SHAREGPT_LIKE, "documents-heavy": DOCUMENTS_HEAVY}


MAX_LOAD_REQUESTS = 1_000_000  # rate x duration: a day at 11/s; each is planned (and held) before the first is sent


@dataclass(frozen=True)
class LoadSpec:
    rate: float  # requests per second (Poisson)
    duration_s: float
    seed: int = 0
    mix: tuple[MixComponent, ...] = SHAREGPT_LIKE

    def __post_init__(self) -> None:
        if not (self.rate > 0 and math.isfinite(self.rate)):
            raise ValueError(f"rate {self.rate!r}: must be > 0 requests/s")
        if not (self.duration_s > 0 and math.isfinite(self.duration_s)):
            raise ValueError(f"duration {self.duration_s!r}: must be > 0 s")
        if self.rate * self.duration_s > MAX_LOAD_REQUESTS:  # --rate 1e308 planned for ever (issue 31)
            raise ValueError(f"{self.rate * self.duration_s:.3g} requests: at most {MAX_LOAD_REQUESTS:,} in one run")
        if not self.mix or any(c.weight < 0 for c in self.mix) or sum(c.weight for c in self.mix) <= 0:
            raise ValueError("the mix needs components with non-negative weights summing above 0")


@dataclass(frozen=True)
class LoadRequest:
    at_s: float  # offset from the start
    prompt_tokens: int
    max_tokens: int
    component: str
    seed: int  # the prompt's ids come from it (measure.prompts.cold_prompt with salt f"load-{seed}")

    @property
    def salt(self) -> str:
        return f"load-{self.seed}"


def _draw(rng: np.random.Generator, median: float, sigma: float, low: int, high: int) -> int:
    return int(np.clip(round(float(rng.lognormal(math.log(median), sigma))), low, high))


def schedule(spec: LoadSpec) -> list[LoadRequest]:
    """The requests of one run, in arrival order (the same for the same spec)."""
    rng = np.random.default_rng(spec.seed)
    weights = np.asarray([c.weight for c in spec.mix], dtype=np.float64)
    weights /= weights.sum()
    out: list[LoadRequest] = []
    t = 0.0
    while True:
        t += float(rng.exponential(1.0 / spec.rate))
        if t >= spec.duration_s:
            return out
        c = spec.mix[int(rng.choice(len(spec.mix), p=weights))]
        out.append(LoadRequest(
            at_s=t,
            prompt_tokens=_draw(rng, c.prompt_median, c.prompt_sigma, c.prompt_min, c.prompt_max),
            max_tokens=_draw(rng, c.output_median, c.output_sigma, c.output_min, c.output_max),
            component=c.name,
            seed=int(rng.integers(0, 2**62)),
        ))


__all__ = ["DOCUMENTS_HEAVY", "LoadRequest", "LoadSpec", "MAX_LOAD_REQUESTS", "MIXES", "MixComponent", "SHAREGPT_LIKE",
           "schedule"]
