"""The exporter's memory under hostile trace traffic (issue 24; docs/security.md states the peak).

    python tests/benchmarks/bench_trace_receiver.py [--flood-s 90] [--bomb-rounds 3] [--senders 8] [--bomb-mib 2048]
    python tests/benchmarks/bench_trace_receiver.py --quick   # one round of 64 MiB bombs, 1 s floods (CI)

`pdexporter run --passive -D 2` (the real CLI, on its embedded engine) in a child process, its
trace receiver on its own port without a token (the worst case: anyone can post). Then, in turn:

1. gzip bombs, four at once, `--bomb-rounds` times: 2 GB of zeros in ~2 MB of gzip (it fits the
   4 MiB wire limit, so the receiver inflates it, up to its 8 MiB decompressed limit), and a
   9.4 MB body that inflates to 2 GB, sent without Content-Length (read up to the wire limit);
2. a flood of small exports for `--flood-s` s from `--senders` connections: one span each, with
   plausible timestamps and fresh request ids (taken up to the request rate, the rest 429), every
   other one with timestamps an hour ahead (taken by the receiver, dropped by the intake);
3. a flood of packed exports for as long: 500 spans each (taken up to the span rate): what passive
   mode keeps for its attribution horizon (~70 s) is the most a sender can make it hold.

It samples the exporter process's RSS every 50 ms (its engine is another process, not counted),
times a GET /metrics every 200 ms, and prints the peak RSS (and the kernel's high-water mark),
the slowest scrape, and what the receiver answered. The chart's memory limit is 512Mi.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import os
import re
import signal
import subprocess
import sys
import time
import zlib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import aiohttp
from quickmode import parse_args

from pdexporter.client.traces import PROTOBUF, RequestTrace, encode_traces
from tests.helpers import free_port


def _status_kb(pid: int, field: str) -> float:
    text = Path(f"/proc/{pid}/status").read_text()
    match = re.search(rf"^{field}:\s+(\d+) kB", text, re.MULTILINE)
    return float(match.group(1)) if match else 0.0


def _zeros_bomb(total: int) -> bytes:
    c = zlib.compressobj(9, zlib.DEFLATED, 31)
    block = b"\0" * (1 << 20)
    return b"".join(c.compress(block) for _ in range(total >> 20)) + c.flush()


def _audit_bomb(total: int) -> bytes:
    """~9.4 MB of gzip that inflate to `total` (2 GB): zeros with 3.1 KB of noise a MiB (the audit's bomb)."""
    c = zlib.compressobj(6, zlib.DEFLATED, 31)
    noise = os.urandom(3100)
    block = b"\0" * ((1 << 20) - len(noise)) + noise
    return b"".join(c.compress(block) for _ in range(total >> 20)) + c.flush()


class Watch:
    def __init__(self, pid: int, metrics_url: str) -> None:
        self.pid, self.metrics_url = pid, metrics_url
        self.peak_mb = 0.0
        self.slowest_scrape_s = 0.0
        self.scrape_errors = 0
        self._stop = False

    async def run(self, session: aiohttp.ClientSession) -> None:
        next_scrape = 0.0
        while not self._stop:
            self.peak_mb = max(self.peak_mb, _status_kb(self.pid, "VmRSS") / 1024)
            now = time.monotonic()
            if now >= next_scrape:
                next_scrape = now + 0.2
                t0 = time.monotonic()
                try:
                    async with session.get(self.metrics_url, timeout=aiohttp.ClientTimeout(total=30)) as resp:
                        await resp.read()
                except aiohttp.ClientError:
                    self.scrape_errors += 1
                self.slowest_scrape_s = max(self.slowest_scrape_s, time.monotonic() - t0)
            await asyncio.sleep(0.05)

    def stop(self) -> None:
        self._stop = True


async def _post(
    session: aiohttp.ClientSession,
    url: str,
    body: bytes | object,
    headers: dict[str, str],
    answers: collections.Counter[str],
) -> None:
    try:
        async with session.post(
            url, data=body, headers=headers, timeout=aiohttp.ClientTimeout(total=60)
        ) as resp:
            await resp.read()
            answers[str(resp.status)] += 1
    except aiohttp.ClientError as exc:
        answers[type(exc).__name__] += 1


async def _chunked(body: bytes):  # type: ignore[no-untyped-def]
    for i in range(0, len(body), 1 << 16):
        yield body[i : i + (1 << 16)]


async def attack(args: argparse.Namespace, pid: int, metrics_url: str, traces_url: str) -> dict[str, object]:
    print("building the bombs ...", flush=True)
    zeros = _zeros_bomb(args.bomb_mib << 20)
    audit = _audit_bomb(args.bomb_mib << 20)
    print(
        f"  {args.bomb_mib} MiB of zeros in {len(zeros) / 1e6:.1f} MB; the audit's bomb: {len(audit) / 1e6:.1f} MB",
        flush=True,
    )
    gz = {"Content-Type": PROTOBUF, "Content-Encoding": "gzip"}
    figures: dict[str, object] = {}
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        baseline = _status_kb(pid, "VmRSS") / 1024
        figures["rss_before_mb"] = baseline
        watch = Watch(pid, metrics_url)
        watcher = asyncio.create_task(watch.run(session))
        bombs: collections.Counter[str] = collections.Counter()
        t0 = time.monotonic()
        for _ in range(args.bomb_rounds):
            await asyncio.gather(*(_post(session, traces_url, zeros, gz, bombs) for _ in range(4)))
            await asyncio.gather(*(_post(session, traces_url, _chunked(audit), gz, bombs) for _ in range(4)))
        figures["bombs"] = dict(bombs)
        figures["bombs_s"] = time.monotonic() - t0
        figures["bombs_peak_mb"] = watch.peak_mb
        for name, per_export in (("flood", 1), ("packed", 500)):
            answers: collections.Counter[str] = collections.Counter()
            sent = 0
            end = time.monotonic() + args.flood_s

            async def sender(
                k: int,
                per_export: int = per_export,
                name: str = name,
                end: float = end,
                answers: collections.Counter[str] = answers,
            ) -> None:
                nonlocal sent
                i = 0
                while time.monotonic() < end:
                    now = time.time_ns()
                    spans = []
                    for j in range(per_export):
                        ahead = 3600 * 10**9 if (i + j) % 2 else 0
                        spans.append(
                            RequestTrace(
                                f"{name}-{k}-{i}-{j}",
                                now - 10**9 + ahead,
                                now + ahead,
                                prompt_tokens=1000,
                                ttft_s=0.2,
                                max_tokens=100,
                            )
                        )
                    await _post(
                        session, traces_url, encode_traces(spans, engine="vllm"), {"Content-Type": PROTOBUF}, answers
                    )
                    sent += 1
                    i += 1

            await asyncio.gather(*(sender(k) for k in range(args.senders)))
            figures[name] = dict(answers)
            figures[f"{name}_exports"] = sent
            figures[f"{name}_peak_mb"] = watch.peak_mb
        await asyncio.sleep(2.0)
        watch.stop()
        await watcher
        figures["peak_mb"] = watch.peak_mb
        figures["hwm_mb"] = _status_kb(pid, "VmHWM") / 1024
        figures["slowest_scrape_s"] = watch.slowest_scrape_s
        figures["scrape_errors"] = watch.scrape_errors
        async with session.get(metrics_url) as resp:
            text = await resp.text()
        figures["counted"] = {
            m.group(1): float(m.group(2))
            for m in re.finditer(
                r'^pdexporter_trace_rejections_total\{reason="([a-z-]+)"\} (\S+)$', text, re.MULTILINE
            )
            if float(m.group(2))
        }
        figures["traces"] = {
            m.group(1): float(m.group(2))
            for m in re.finditer(
                r'^pdexporter_request_traces_total\{kind="([a-z-]+)"\} (\S+)$', text, re.MULTILINE
            )
            if float(m.group(2))
        }
    return figures


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--flood-s", type=float, default=90.0)
    parser.add_argument("--bomb-rounds", type=int, default=3)
    parser.add_argument("--senders", type=int, default=8)
    parser.add_argument("--bomb-mib", type=int, default=2048, help="what each gzip bomb inflates to (MiB)")
    args = parse_args(parser, flood_s=1.0, bomb_rounds=1, senders=2, bomb_mib=64)
    port, traces_port = free_port(), free_port()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "pdexporter",
            "run",
            "--passive",
            "--decode-batch-size",
            "2",
            "--listen",
            f"127.0.0.1:{port}",
            "--traces-listen",
            f"127.0.0.1:{traces_port}",
        ],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    metrics_url = f"http://127.0.0.1:{port}/metrics"
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                with __import__("urllib.request").request.urlopen(metrics_url, timeout=2) as resp:
                    if b"pdexporter_up 1.0" in resp.read():
                        break
            except OSError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                print(proc.stderr.read().decode() if proc.stderr else "", file=sys.stderr)  # type: ignore[union-attr]
                return 1
            time.sleep(0.5)
        figures = asyncio.run(
            attack(args, proc.pid, metrics_url, f"http://127.0.0.1:{traces_port}/v1/traces")
        )
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
    print(f"exporter RSS before the attack: {figures['rss_before_mb']:.0f} MB")
    print(
        f"gzip bombs ({args.bomb_rounds} rounds of 4 + 4 at once): answers {figures['bombs']}, "
        f"{figures['bombs_s']:.1f} s, peak RSS {figures['bombs_peak_mb']:.0f} MB"
    )
    for name, per_export in (("flood", 1), ("packed", 500)):
        print(
            f"{name}: {figures[f'{name}_exports']} exports of {per_export} span(s) in {args.flood_s:g} s from "
            f"{args.senders} senders, answers {figures[name]}, peak RSS so far {figures[f'{name}_peak_mb']:.0f} MB"
        )
    print(f"refusals counted on /metrics: {figures['counted']}; spans by kind: {figures['traces']}")
    print(
        f"peak RSS {figures['peak_mb']:.0f} MB (VmHWM {figures['hwm_mb']:.0f} MB; chart limit 512 MiB); "
        f"slowest /metrics {figures['slowest_scrape_s'] * 1e3:.0f} ms, {figures['scrape_errors']} failed scrapes"
    )
    return 0 if figures["hwm_mb"] < 512 else 1  # type: ignore[operator]


if __name__ == "__main__":
    sys.exit(main())
