"""One duration syntax for every option and file: `500ms`, `30s`, `5m`, `1h`, `1h30m`, `2d`, or a
bare number of seconds (Prometheus' units, spaces allowed between number and unit); and a record's
ISO-8601 time stamp (`started_at`) as seconds since the epoch (`iso_epoch_s`)."""

from __future__ import annotations

import datetime as dt
import math
import re

from pdexporter.errors import ConfigError

__all__ = [
    "HINT", "UNIT_S", "iso_epoch_s", "parse_duration",
]

_NUMBER = re.compile(r"\d+(?:\.\d*)?|\.\d+")
_PART = re.compile(rf"({_NUMBER.pattern})(ms|s|m|h|d|w|y)")
UNIT_S = {"ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 604800.0, "y": 31536000.0}
HINT = "expected a duration like 500ms, 30s, 5m, 1h or 1h30m (or seconds)"


def parse_duration(text: str, option: str = "duration") -> float:
    """Seconds; a bad value raises `ConfigError` naming `option` and the value."""
    t = re.sub(r"\s+", "", str(text))  # "10 s" reads as "10s"
    if _NUMBER.fullmatch(t):  # bare seconds (digits and a point: no sign, exponent, inf or nan)
        seconds = float(t)
    else:
        pos, seconds = 0, 0.0
        # parts back to back, each matched where the last ended (a search from every digit of a long
        # run of them was quadratic: 2 s for 10,000 digits)
        while pos < len(t) and (match := _PART.match(t, pos)):
            seconds += float(match.group(1)) * UNIT_S[match.group(2)]
            pos = match.end()
        if pos != len(t) or pos == 0:
            raise ConfigError(f"{option} {text!r}: {HINT}") from None
    if not math.isfinite(seconds) or seconds < 0:
        raise ConfigError(f"{option} {text!r}: {HINT}")
    return seconds


def iso_epoch_s(text: str | None) -> float | None:
    """An ISO-8601 time stamp (a repetition's `started_at`) as seconds since the epoch; None where
    there is none or it does not read as one."""
    if not text:
        return None
    try:
        return dt.datetime.fromisoformat(text).timestamp()
    except ValueError:
        return None
