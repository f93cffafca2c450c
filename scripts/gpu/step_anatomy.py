"""Issues 30, 32 and 36 (docs/status.md, "The one thing to know first"): the inside of vLLM's steps from its own torch
profiler trace, to say whether the eager step's slow state is the CPU's side of the step or the GPU's.

    python3 scripts/gpu/step_anatomy.py TRACE.json[.gz] [...] [--prompts 512,1024,4096] [--csv OUT.csv] [--md OUT.md]

A trace is what vLLM's `--profiler-config '{"profiler": "torch", ...}'` writes between POST /start_profile and
/stop_profile (torch.profiler's Chrome trace: `user_annotation` spans on the CPU, `cuda_runtime`/`cuda_driver` calls,
`kernel`/`gpu_memcpy`/`gpu_memset` events on the GPU, a launch and its kernels sharing `args.correlation`). While it
profiles, vLLM's worker wraps each step in `execute_context_R(T)_generation_G(N)` (R prefill requests of T tokens in
all beside G decodes): one step, named by what it ran. With `VLLM_CUSTOM_SCOPES_FOR_PROFILING=1` the model runner
marks its forward inside it (`gpu_model_runner: forward`). A trace without the step spans (the synthetic ones of the
tests) is read by its forward spans. Per step it takes, on the span's thread:

- `cpu_ms`: the step's CPU time (Python, ATen dispatch and the launch calls; the eager step's launch path), and
  `forward_ms` the forward's part of it where marked;
- `launches`, `launch_us`: the kernel launch calls in it and their mean duration (the driver's part of the path);
- `dispatch_ms`: `cpu_ms` less the launch calls (Python and ATen between them);
- `gpu_ms`: the GPU's busy time on the kernels those calls launched (their union), `span_ms` first kernel start to
  last kernel end, `lag_ms` the first launch to its kernel's start (how far the GPU was behind when the step began);
- `wall_ms`: the step's start to the later of its end and its last kernel's end.

A step with a `cudaGraphLaunch` is a graph step (the decode steps on vLLM's defaults); an eager step of one prefill
request is grouped by its tokens (P, from the step's name). Without names, eager steps with many launches are grouped
by `gpu_ms` into as many groups as `--prompts` names (split at the widest gaps of log gpu_ms, named in ascending
order), which a GPU-side slow state could blur. Standard library only: it runs on the GPU machine beside the engine.

Per group it prints the fast and the slow steps (wall under 0.9 or over 1.1 of the group's median) side by side on
each quantity, and r(wall, quantity): the reading fixed in
`results/h100-vllm0.22-llama-3.2-3b-instruct-anatomy/PLAN.md`.
"""

from __future__ import annotations

import argparse
import bisect
import csv
import gzip
import json
import math
import re
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from host_levels import FAST, SLOW  # noqa: E402 (a step's wall over its group's median: the plans' fast and slow)

FORWARD = "gpu_model_runner: forward"
STEP = re.compile(r"execute_context_(\d+)\((\d+)\)_generation_(\d+)\((\d+)\)")
GPU_CATS = {"kernel", "gpu_memcpy", "gpu_memset"}
RUNTIME_CATS = {"cuda_runtime", "cuda_driver"}
FIELDS = ("wall_ms", "cpu_ms", "forward_ms", "dispatch_ms", "launches", "launch_us", "gpu_ms", "span_ms", "lag_ms")


def load(path: Path) -> list[dict]:
    """The complete ('X') events of one trace file."""
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as f:
        doc = json.load(f)
    events = doc["traceEvents"] if isinstance(doc, dict) else doc
    return [e for e in events if e.get("ph") == "X" and "ts" in e and "dur" in e]


def _union_ms(spans: list[tuple[float, float]]) -> float:
    total, end = 0.0, -math.inf
    for s, e in sorted(spans):
        if e > end:
            total += e - max(s, end)
            end = e
    return total / 1e3


def steps(events: list[dict]) -> list[dict]:
    """One row per step span (the forward spans where the trace has none): the quantities the module docstring
    names, `t` (its start, µs on the trace's clock), `graph` (a cudaGraphLaunch in it) and, from a step's name,
    `prefills` (R), `P` (T) and `D` (G)."""
    by_corr: dict[int, list[tuple[float, float]]] = defaultdict(list)
    calls: dict[tuple, list[dict]] = defaultdict(list)  # per (pid, tid), sorted by start
    named, forwards = [], []
    for e in events:
        cat = e.get("cat")
        if cat in GPU_CATS and "correlation" in e.get("args", {}):
            by_corr[e["args"]["correlation"]].append((float(e["ts"]), float(e["ts"]) + float(e["dur"])))
        elif cat in RUNTIME_CATS:
            calls[(e.get("pid"), e.get("tid"))].append(e)
        elif cat == "user_annotation" and e.get("name") == FORWARD:
            forwards.append(e)
        elif cat == "user_annotation" and STEP.fullmatch(e.get("name", "")):
            named.append(e)
    starts = {}
    for key, lst in calls.items():
        lst.sort(key=lambda x: x["ts"])
        starts[key] = [float(x["ts"]) for x in lst]
    forwards.sort(key=lambda x: x["ts"])
    fw_starts = [float(f["ts"]) for f in forwards]
    out = []
    for span in sorted(named or forwards, key=lambda x: x["ts"]):
        s, d = float(span["ts"]), float(span["dur"])
        key = (span.get("pid"), span.get("tid"))
        lst, st = calls.get(key, []), starts.get(key, [])
        inside = lst[bisect.bisect_left(st, s):bisect.bisect_right(st, s + d)]
        launch_calls = [c for c in inside if "Launch" in c["name"] and "Graph" not in c["name"]]
        kernels = [k for c in inside for k in by_corr.get(c.get("args", {}).get("correlation"), [])]
        launch_total = sum(float(c["dur"]) for c in launch_calls)
        fw = [forwards[i] for i in range(bisect.bisect_left(fw_starts, s), bisect.bisect_right(fw_starts, s + d))]
        row = {"t": s, "graph": any("GraphLaunch" in c["name"] for c in inside), "cpu_ms": d / 1e3,
               "forward_ms": sum(float(f["dur"]) for f in fw) / 1e3 if fw else math.nan,
               "launches": len(launch_calls), "launch_us": launch_total / len(launch_calls) if launch_calls else 0.0,
               "dispatch_ms": (d - launch_total) / 1e3, "gpu_ms": _union_ms(kernels)}
        m = STEP.fullmatch(span["name"])
        if m:
            row |= {"prefills": int(m[1]), "P": int(m[2]), "D": int(m[3])}
        if kernels:
            first, last = min(k[0] for k in kernels), max(k[1] for k in kernels)
            row |= {"span_ms": (last - first) / 1e3, "lag_ms": (first - float(inside[0]["ts"])) / 1e3,
                    "wall_ms": (max(s + d, last) - s) / 1e3}
        else:
            row |= {"span_ms": 0.0, "lag_ms": 0.0, "wall_ms": d / 1e3}
        out.append(row)
    return out


def group_eager(rows: list[dict], prompts: list[int], min_launches: int = 50) -> dict[int, list[dict]]:
    """The eager steps (no graph launch) by prompt: the one-prefill steps by their names' P where the steps are named,
    else those of at least `min_launches` launches split into len(prompts) groups at the widest gaps of log gpu_ms,
    named by `prompts` in ascending order."""
    named = [r for r in rows if r.get("prefills") == 1 and not r["graph"]]
    if named:
        by: dict[int, list[dict]] = defaultdict(list)
        for r in named:
            by[r["P"]].append(r)
        return {p: sorted(by[p], key=lambda r: r["gpu_ms"]) for p in sorted(by)}
    eager = sorted((r for r in rows if not r["graph"] and r["launches"] >= min_launches and r["gpu_ms"] > 0),
                   key=lambda r: r["gpu_ms"])
    k = len(prompts)
    if len(eager) < k:
        return {}
    logs = [math.log(r["gpu_ms"]) for r in eager]
    cuts = sorted(sorted(range(1, len(eager)), key=lambda i: logs[i] - logs[i - 1], reverse=True)[:k - 1])
    bounds = [0, *cuts, len(eager)]
    return {p: eager[a:b] for p, a, b in zip(sorted(prompts), bounds, bounds[1:])}


def _r(xs: list[float], ys: list[float]) -> float:
    """Pearson r, NaN where either side is constant or shorter than three."""
    if len(xs) < 3 or len(set(xs)) < 2 or len(set(ys)) < 2:
        return float("nan")
    return statistics.correlation(xs, ys)


def compare(group: list[dict]) -> list[str]:
    """The fast and the slow steps of one group side by side, and r(wall, each quantity)."""
    med = statistics.median(r["wall_ms"] for r in group)
    fast = [r for r in group if r["wall_ms"] < FAST * med]
    slow = [r for r in group if r["wall_ms"] > SLOW * med]
    lines = [f"{len(group)} steps, wall median {med:.2f} ms; fast (< {FAST}) {len(fast)}, slow (> {SLOW}) {len(slow)}",
             "", "| quantity | fast (median) | slow (median) | slow / fast | r(wall, quantity) |",
             "|---|---|---|---|---|"]
    for key in FIELDS:
        f = statistics.median(r[key] for r in fast) if fast else float("nan")
        s = statistics.median(r[key] for r in slow) if slow else float("nan")
        r = _r([r["wall_ms"] for r in group], [r[key] for r in group])
        lines.append(f"| {key} | {f:.3f} | {s:.3f} | {s / f if f else float('nan'):.2f} | {r:+.2f} |")
    return lines


def states(groups: dict[int, list[dict]], graph_steps: list[dict], bin_s: float = 2.0) -> list[str]:
    """Per `bin_s` of trace time: the smallest prompts' mean wall over their median against the largest's, and
    against the graph steps' CPU time in the same bin (the block state of scripts/eager_levels.py, inside a step)."""
    if len(groups) < 2:
        return []
    small, big = groups[min(groups)], groups[max(groups)]

    def binned(rows: list[dict], key: str) -> dict[tuple, float]:
        med = statistics.median(r[key] for r in rows)
        acc: dict[tuple, list[float]] = defaultdict(list)
        for r in rows:  # each trace file keeps its own clock: a bin is (file, bin)
            acc[(r.get("trace"), int(r["t"] // (bin_s * 1e6)))].append(r[key] / med)
        return {b: statistics.fmean(v) for b, v in acc.items()}

    a, b = binned(small, "wall_ms"), binned(big, "wall_ms")
    g = binned(graph_steps, "cpu_ms") if len(graph_steps) > 2 else {}
    lines = []
    for label, other in ((f"P = {max(groups)} wall", b), ("graph steps' CPU time", g)):
        both = sorted(set(a) & set(other))
        if len(both) > 3:
            r = _r([a[i] for i in both], [other[i] for i in both])
            lines.append(f"- per {bin_s:g} s: r(P = {min(groups)} wall, {label}) {r:+.2f} over {len(both)} bins")
    return lines


def report(rows: list[dict], prompts: list[int]) -> str:
    groups = group_eager(rows, prompts)
    graph_steps = [r for r in rows if r["graph"]]
    how = "named by their tokens" if any("P" in r for r in rows) else "grouped by GPU time"
    lines = ["# Inside the steps (scripts/gpu/step_anatomy.py)", "",
             f"{len(rows)} steps: {len(graph_steps)} graph steps, "
             f"{sum(len(g) for g in groups.values())} eager steps {how} as P = "
             f"{', '.join(map(str, sorted(groups)))}.", ""]
    for p, group in groups.items():
        gpu = [r["gpu_ms"] for r in group]
        lines += [f"## P = {p} (GPU busy {min(gpu):.2f}–{max(gpu):.2f} ms)", "", *compare(group), ""]
    if graph_steps:
        lines += ["## Graph steps", "", *compare(graph_steps), ""]
    lines += ["## States", "", *(states(groups, graph_steps) or ["Fewer than two groups or four shared bins."]), ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("traces", nargs="+", type=Path)
    ap.add_argument("--prompts", default="512,1024,4096", help="the eager prefills' P, comma-separated")
    ap.add_argument("--csv", type=Path)
    ap.add_argument("--md", type=Path)
    a = ap.parse_args(argv)
    try:
        prompts = [int(x) for x in a.prompts.split(",") if x.strip()]
    except ValueError:
        ap.error(f"--prompts {a.prompts!r}: comma-separated integers expected")
    rows: list[dict] = []
    t0 = time.monotonic()
    for i, path in enumerate(a.traces, 1):
        try:
            found = steps(load(path))
        except (OSError, ValueError, KeyError) as exc:
            print(f"{path}: not a torch profiler trace ({exc})", file=sys.stderr)
            return 2
        if not found:
            print(f"{path}: no step or '{FORWARD}' span (was the engine started with --profiler-config?)",
                  file=sys.stderr)
            return 2
        rows += [r | {"trace": path.name} for r in found]
        took = time.monotonic() - t0  # a trace of seconds of a busy engine is ~10^6 events: tens of seconds
        eta = took / i * (len(a.traces) - i)
        print(f"step_anatomy: {i}/{len(a.traces)} traces read ({path.name}: {len(found)} steps), {took:.0f} s, "
              f"ETA {eta:.0f} s", file=sys.stderr, flush=True)
    text = report(rows, prompts)
    if a.csv:
        with a.csv.open("w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=["trace", "t", "graph", "prefills", "D", "P", *FIELDS])
            w.writeheader()
            w.writerows(rows)
    if a.md:
        a.md.write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
