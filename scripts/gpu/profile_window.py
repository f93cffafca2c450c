"""Issues 30, 32 and 36: open vLLM's torch profiler for a few seconds at set times while a sweep runs beside it.

    python3 scripts/gpu/profile_window.py OUT/windows.jsonl --url http://127.0.0.1:8000 --at 60 --at 180 --for 10

Waits until `URL/health` answers (the engine up), then for each `--at` (seconds after that), POSTs `/start_profile`,
waits `--for` seconds and POSTs `/stop_profile` (which returns once the trace is written: the engine stalls while it
writes, and the sweep's windows around it are marked by this file). The engine must run with `--profiler-config`
(scripts/gpu/step-anatomy.sh's sweep does). One JSON line a window, on the clock the records use (CLOCK_MONOTONIC):
{"window": i, "start": [ns before the POST, ns after], "stop": [ns before, ns after], "ok": bool, "error": str,
"clock_offset_ns": the wall clock less the monotonic one (what joins the trace's wall-clock steps to the records)}.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from launch_probe import wait_for  # noqa: E402 (the engine's /health, as the launch probe waits for it)


def post(url: str, timeout_s: float) -> tuple[int, int, str]:
    """POST with an empty body: (monotonic ns before, after, the error or '')."""
    t0 = time.monotonic_ns()
    try:
        req = urllib.request.Request(url, data=b"", method="POST")
        with urllib.request.urlopen(req, timeout=timeout_s) as r:  # noqa: S310 (a local engine)
            err = "" if r.status == 200 else f"HTTP {r.status}"
    except OSError as exc:
        err = f"{type(exc).__name__}: {exc}"
    return t0, time.monotonic_ns(), err


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--url", default="http://127.0.0.1:8000")
    ap.add_argument("--at", type=float, action="append", required=True, help="seconds after /health answers")
    ap.add_argument("--for", dest="span", type=float, default=10.0, help="seconds each window stays open")
    ap.add_argument("--health-timeout", type=float, default=600.0)
    ap.add_argument("--stop-timeout", type=float, default=300.0, help="how long writing a trace may take")
    a = ap.parse_args(argv)
    if a.span <= 0 or any(t < 0 for t in a.at):
        ap.error(f"--for {a.span} and every --at {a.at} must be positive")
    if not wait_for(a.url + "/health", a.health_timeout):
        print(f"profile_window: {a.url}/health did not answer in {a.health_timeout:.0f} s", file=sys.stderr)
        return 1
    up = time.monotonic()
    with a.out.open("a") as f:
        for i, at in enumerate(sorted(a.at)):
            time.sleep(max(0.0, up + at - time.monotonic()))
            start = post(a.url + "/start_profile", 60)
            time.sleep(a.span)
            stop = post(a.url + "/stop_profile", a.stop_timeout)
            err = start[2] or stop[2]
            offset = time.time_ns() - time.monotonic_ns()
            f.write(json.dumps({"window": i, "start": start[:2], "stop": stop[:2], "ok": not err, "error": err,
                                "clock_offset_ns": offset}) + "\n")
            f.flush()
            print(f"profile_window {i}: {'ok' if not err else err} "
                  f"(stop took {(stop[1] - stop[0]) / 1e9:.1f} s)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
