"""A window that cannot start says why the probes are missing (the runtime audit of session 22: an
engine restarted with another model answered every probe 404 "model does not exist", and the
exporter said only "no injection within 60 s: 0/4 probe streams open", for ever)."""

from __future__ import annotations

import pytest

from pdexporter.errors import EngineHTTPError, MeasurementError
from pdexporter.exporter.config import build_config
from pdexporter.exporter.live import ContinuousProbes


class _View:
    """A `LiveView` (test double) whose probes never open."""

    def __init__(self, error: BaseException | None) -> None:
        self.config = build_config(probe_streams=4, chunk_size=2048, prefill_tokens=64, target="http://e:1",
                                   protocol={"decode_context_tokens": 64, "decode_output_tokens": 160})
        self.config = self.config.model_copy(update={"ready_timeout_s": 0.05})
        self.stopping, self.quiet_from, self.last_error = False, 0.0, error

    def refresh(self) -> None: ...

    def live_states(self) -> list:  # type: ignore[type-arg]
        return []

    def all_states(self) -> list:  # type: ignore[type-arg]
        return []

    def hold(self, t_ns: float) -> None: ...


async def test_the_probes_last_error_is_in_the_line() -> None:
    error = EngineHTTPError("http://e:1/v1/completions", 404, "The model `qwen3-coder-30b-a3b` does not exist.")
    with pytest.raises(MeasurementError, match=r"0/4 probe streams open \(the probes' last error: .*404.*does not "
                                               r"exist"):
        await ContinuousProbes(_View(error)).ready(None, 4, 64)
    with pytest.raises(MeasurementError) as info:
        await ContinuousProbes(_View(None)).ready(None, 4, 64)
    assert "last error" not in str(info.value)
