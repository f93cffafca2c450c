"""Synthetic production load: Poisson arrivals of requests whose prompt and output lengths follow
a ShareGPT-like mix, generated locally from a seed (nothing is downloaded).

`mix` is pure (the distribution and the schedule); `drive` sends a schedule through any
`EngineDriver` (HTTP against vLLM, or the embedded engine in process, real or virtual time).
`pdexporter load` is the command.
"""

from pdexporter.load.mix import SHAREGPT_LIKE, LoadRequest, LoadSpec, MixComponent, schedule

__all__ = ["LoadRequest", "LoadSpec", "MixComponent", "SHAREGPT_LIKE", "schedule"]
