"""The limits on every number a user or a file gives pdexporter, in one place.

Option parsers, sweep files, the exporter's settings and records all check against these, so a
typo (`-P 99999999999999999999`, `reps: 1e9`) is one line naming the field and the bound, before
anything starts, instead of a traceback or a run that cannot end. Why each bound:

- `MAX_TOKENS` (prompt lengths P, chunk sizes B, the probes' context and output): 10,000,000. The
  longest context any served model offers today is 10M tokens (Llama 4 Scout); a cold prompt is
  held in memory as token ids and sent as JSON (~8 bytes a token), so 10M is ~80 MB per request.
  The engine's own limit is tighter and is checked when it is known (`prompt_fit_problem`).
- `MAX_DECODE_BATCH` (D, the probe streams): 1024, vLLM's largest default `max_num_seqs`; more
  probes than the engine runs at once queue, and the seed needs exactly D decodes running.
- `MAX_REPS` (repetitions of a point): 1000. A repetition takes seconds to minutes on a GPU; the
  seed uses 5, and 1000 of the slowest ones is already a day.
- `MAX_RETRIES` (retries and CV re-runs): 100.
- `MAX_SECONDS` (timeouts, cooldowns, periods): one week, longer than any run is meant to wait.
"""

from __future__ import annotations

MAX_TOKENS = 10_000_000
MAX_DECODE_BATCH = 1024
MIN_DECODE_BATCH = 0  # D = 0: the prefill alone, a point of every grid (records, sweep files, `measure`)
MIN_PROBE_STREAMS = 1  # the live exporter's probes: it watches one decode at least
MAX_REPS = 1000
MAX_RETRIES = 100
MAX_SECONDS = 7 * 24 * 3600.0

__all__ = ["MAX_DECODE_BATCH", "MAX_REPS", "MAX_RETRIES", "MAX_SECONDS", "MAX_TOKENS", "MIN_DECODE_BATCH",
           "MIN_PROBE_STREAMS", "decode_batch_problem", "out_of_bounds", "prompt_fit_problem"]


def decode_batch_problem(d: int, *, live: bool = False) -> str | None:
    """Why D (the decode batch size, the probe streams) is out of its bounds, or None: the one rule
    options, sweep files, records and the exporter's settings follow (the pydantic fields state the
    same bounds). `live`: the exporter's probes, one decode at least."""
    low = MIN_PROBE_STREAMS if live else MIN_DECODE_BATCH
    if d < low:
        return f"must be >= {low}"
    return out_of_bounds(d, low, MAX_DECODE_BATCH)


def out_of_bounds(value: float, low: float, high: float) -> str | None:
    """`must be between low and high` when `value` is not (None when it is)."""
    if low <= value <= high:
        return None
    def show(x: float) -> str:
        return str(x) if isinstance(x, int) else f"{x:g}"

    return f"must be between {show(low)} and {show(high)}"


def prompt_fit_problem(prefill_tokens: int, prefill_max_tokens: int, decode_context_tokens: int,
                       decode_output_tokens: int, max_model_len: int | None) -> str | None:
    """Why a point's requests would not fit the engine's context (its `max_model_len` from
    /v1/models), or None. A request fits when its prompt plus its output tokens do."""
    if max_model_len is None:
        return None
    if prefill_tokens + prefill_max_tokens > max_model_len:
        return (f"{prefill_tokens} prompt tokens + {prefill_max_tokens} output token(s) exceed the engine's "
                f"max_model_len {max_model_len} (from /v1/models)")
    if decode_context_tokens + decode_output_tokens > max_model_len:
        return (f"the probes' {decode_context_tokens} context + {decode_output_tokens} output tokens exceed the "
                f"engine's max_model_len {max_model_len} (from /v1/models)")
    return None
