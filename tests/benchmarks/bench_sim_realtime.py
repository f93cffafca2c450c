"""Real-time fidelity of `pdexporter sim serve`: how far the token cadence seen by a client over HTTP
follows the modelled step time, and the largest D it sustains within 2 %.

For each D, D streams of 256 tokens on the cached 4096-token prefix run together through
pdexporter's own HTTP client (one timestamp per network read, tokens counted from usage), as the
measurement protocol reads them. The p50 of all intervals after the first 16 tokens is compared
with the model's decode step time over the same context range. Server and client share this
machine's cores (and whatever else runs on it): the figure is for this machine, now. The modelled
step grows with D, so tokens/s (D / step) is what the server really has to sustain.

    python tests/benchmarks/bench_sim_realtime.py [--profile NAME] [--max-d 256] [--tolerance 0.02]
    python tests/benchmarks/bench_sim_realtime.py --quick   # D = 1 and 2 only (CI)
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import numpy as np  # noqa: E402
from quickmode import parse_args  # noqa: E402

from pdexporter.client.client import EngineClient, completion_request, encode_body  # noqa: E402
from pdexporter.client.stream import TokenStream  # noqa: E402
from pdexporter.launch import SimLauncher  # noqa: E402
from pdexporter.measure.prompts import shared_prefix  # noqa: E402
from pdexporter.measure.window import intervals, token_times  # noqa: E402
from pdexporter.sim.profile import load_profile  # noqa: E402
from pdexporter.sim.steptime import StepTimeModel  # noqa: E402

TOKENS = 256
WARMUP = 16


async def cadence(client: EngineClient, model: str, d: int) -> tuple[float, float, int]:
    body = encode_body(completion_request(model, shared_prefix(4096), TOKENS))
    streams = [TokenStream(f"s{i}") for i in range(d)]
    await asyncio.gather(*[client.stream_into("/v1/completions", body, s) for s in streams])
    lengths = np.concatenate([
        intervals(token_times(s.event_times_ns, s.event_tokens), WARMUP).length_ns for s in streams
    ]) / 1e6
    merged = sum(1 for s in streams for n in s.event_tokens if n > 1)
    return float(np.median(lengths)), float(lengths.mean()), merged


async def main(profile: str, max_d: int, tolerance: float, chunk: int) -> None:
    model = StepTimeModel(load_profile(profile))
    launcher = SimLauncher(profile=profile)
    handle = await launcher.start(chunk)
    rows = []
    try:
        async with EngineClient(handle.url) as client:
            served = await client.resolve_model(None)
            warm = TokenStream("warm")
            await client.stream_into("/v1/completions", encode_body(completion_request(served, shared_prefix(4096), 1)),
                                     warm)
            d, failures = 1, 0
            while d <= max_d and failures < 2:
                modelled = statistics.fmean(model.decode_step_s(d, 4096 + k) for k in range(WARMUP, TOKENS + 1)) * 1e3
                p50, mean, merged = await cadence(client, served, d)
                err = (p50 - modelled) / modelled
                ok = abs(err) <= tolerance
                failures = 0 if ok else failures + 1
                rows.append((d, modelled, p50, mean, err, merged, ok))
                print(f"D={d:4d}  modelled {modelled:7.3f} ms  p50 {p50:7.3f} ms  mean {mean:7.3f} ms  "
                      f"p50 error {err * 100:+6.2f} %  {d / p50 * 1e3:7.0f} tokens/s  merged events {merged:5d}  "
                      f"{'ok' if ok else 'OUT'}", flush=True)
                d = d * 2 if d >= 4 else d + 1 if d < 2 else 4
                if d > 12 and rows[-1][0] < 12:
                    d = 12
    finally:
        await launcher.stop()
    good = [r[0] for r in rows if r[6]]
    largest = max((r[0] for r in rows if r[6] and all(x[6] for x in rows if x[0] <= r[0])), default=None)
    print(f"largest D with p50 cadence within {tolerance * 100:.0f} % (and every smaller D): {largest}")
    print(f"D within the bound: {good}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profile", default="h200-qwen3-coder-30b-a3b")
    parser.add_argument("--max-d", type=int, default=1024, help="vLLM's max_num_seqs caps it at 1024")
    parser.add_argument("--tolerance", type=float, default=0.02)
    parser.add_argument("--chunk", type=int, default=8192)
    args = parse_args(parser, max_d=2)
    print(f"load average before: {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores; {time.strftime('%H:%M:%S')}")
    asyncio.run(main(args.profile, args.max_d, args.tolerance, args.chunk))
