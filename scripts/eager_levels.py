"""Issues 30, 32 and 36 (docs/status.md, "The one thing to know first"): where the one-chunk step's level lives.

    python scripts/eager_levels.py RESULTS_DIR [--control P] [--windows windows.jsonl] [--out levels.md]

Reads one engine's interleaved sweep (`{chunk}/D*_P*.json`, their `raw/` windows; one block = one repetition of
every configuration, seconds apart), `levels.csv` (`scripts/gpu/host_levels.py`'s pairing of each repetition with
the launch probe) and `host-monitor.tgz` (the probe's and nvidia-smi's samples) where they are, and writes:

1. per configuration, the prefill's chunk step as the engine's own log timed it (p10/p50/p90), the penalty's
   median and CV, and the share of repetitions whose step is under 0.9 or over 1.1 of its configuration's median;
2. **the reading fixed in the plan** (`../results/h100-vllm0.22-llama-3.2-3b-instruct-levels/PLAN.md`): over the
   one-chunk prompts below the control, the level (penalty over its configuration's median) against `launch_us`;
   the control's r; the probe's own p90/p10; the verdict (launch path / the engine's own / inconclusive);
3. the probe's nearest sample only (|dt| < 0.15 s, 0.3 s): whether a finer pairing than host_levels' finds what
   the mean over its interval could hide;
4. **the block state**: a block's mean step ratio over the prompts below the control against the control's in the
   same block, its spread over blocks, its lag-1 autocorrelation from block to block, and against the GPU's power
   and power-cap share over the block's span (nvidia-smi every 0.1 s).

`--windows` (scripts/gpu/profile_window.py's file) leaves out the repetitions injected while vLLM's profiler was open
(or within a second of it): the unprofiled repetitions of a profiled engine. Pure arithmetic on committed records;
the GPU-side pairing is host_levels.py's (imported, not repeated).
"""

from __future__ import annotations

import argparse
import gzip
import json
import sys
import tarfile
import tempfile
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts" / "gpu"))
sys.path.insert(0, str(ROOT))

import host_levels  # noqa: E402
from host_levels import FAST, SLOW  # noqa: E402 (a repetition's ratio to its configuration's median)

from pdexporter._internal.atomic import atomic_write_text  # noqa: E402

POWER_CAP = 0x4  # nvidia-smi clocks_event_reasons: SW power cap


def repetitions(results: Path) -> pd.DataFrame:
    """One row per repetition of a D > 0 configuration: D, P, block, its injection (s, the driver's monotonic
    clock), the prefill's first token after it (`first_s`, s), the chunk step (the engine's log; NaN where it has
    none), the penalty, and both over their configuration's medians (`step_ratio`, `ratio`)."""
    out = []
    for path in sorted(results.glob("[0-9]*/D*_P*.json")):
        rec = json.loads(path.read_text())
        c = rec["config"]
        if c["decode_batch_size"] == 0:
            continue
        for r in rec["reps"]:
            penalty = r.get("derived", {}).get("tpot_penalty_ms")
            if penalty is None or not r.get("raw"):  # not measured, or no raw timestamps to place it in time
                continue
            with gzip.open(path.parent / r["raw"]) as f:
                raw = json.load(f)
            steps = r["interference"].get("chunk_step_times_ms") or []
            pre = r["interference"].get("tpot_pre_injection_p50_ms")
            out.append({"D": c["decode_batch_size"], "P": c["new_prefill_tokens"], "block": r.get("block", r["rep"]),
                        "t": raw["t_inject_clock_ns"] / 1e9, "chunks": r["interference"].get("num_chunks_actual"),
                        "step_ms": steps[0] if len(steps) == 1 else np.nan, "penalty_ms": penalty,
                        "pre_ms": np.nan if pre is None else pre,
                        "first_s": (raw["t_first_ns"] - raw["t_inject_ns"]) / 1e9})
    if not out:
        raise SystemExit(f"{results}: no repetitions of a D > 0 configuration under {{chunk}}/D*_P*.json")
    return with_ratios(pd.DataFrame(out).sort_values("t", ignore_index=True))


def with_ratios(df: pd.DataFrame) -> pd.DataFrame:
    """`step_ratio` and `ratio`: the chunk step and the penalty over their configuration's medians in `df`."""
    by = df.groupby(["D", "P"])
    return df.assign(step_ratio=df.step_ms / by.step_ms.transform("median"),
                     ratio=df.penalty_ms / by.penalty_ms.transform("median"),
                     pre_ratio=df.pre_ms / by.pre_ms.transform("median"))


def outside_windows(df: pd.DataFrame, windows: Path) -> pd.DataFrame:
    """The repetitions injected more than a second away from every profiler window (start's POST to stop's answer)."""
    spans = [json.loads(line) for line in windows.read_text().splitlines() if line.strip()]
    keep = pd.Series(True, index=df.index)
    for w in spans:
        keep &= ~df.t.between(w["start"][0] / 1e9 - 1, w["stop"][1] / 1e9 + 1)
    return df[keep]


def _cv(values: pd.Series | np.ndarray) -> float:
    v = np.asarray(values, dtype=float)
    return float(v.std(ddof=1) / v.mean()) if v.size > 1 and v.mean() else float("nan")


def per_config(df: pd.DataFrame, group: int = 5) -> list[str]:
    """Per configuration the step's and the penalty's spread, and over consecutive `group`s of repetitions (a
    seed-like cell of five, time order) the CV of their medians against that of their means."""
    lines = ["| D | P | n | chunk step p10 / p50 / p90 (ms) | penalty p50 (ms) | penalty CV | fast / slow steps "
             f"| CV of {group}-repetition medians / means |", "|---|---|---|---|---|---|---|---|"]
    for (d, p), g in df.groupby(["D", "P"]):
        q = np.nanpercentile(g.step_ms, [10, 50, 90])
        fast, slow = (g.step_ratio < FAST).mean(), (g.step_ratio > SLOW).mean()
        x = g.sort_values("t").penalty_ms.to_numpy()
        cells = [x[i:i + group] for i in range(0, len(x) - group + 1, group)]
        meds, means = _cv([np.median(c) for c in cells]), _cv([c.mean() for c in cells])
        lines.append(f"| {d} | {p} | {len(g)} | {q[0]:.1f} / {q[1]:.1f} / {q[2]:.1f} | {g.penalty_ms.median():.2f} "
                     f"| {_cv(g.penalty_ms):.1%} | {fast:.0%} / {slow:.0%} | {meds:.1%} / {means:.1%} |")
    return lines


def minutes(df: pd.DataFrame, control: int, slow_over_p10: float = 1.4) -> list[str]:
    """Minute by minute since the first injection: the share of the one-chunk steps below the control over
    `slow_over_p10` x their p10 (the fast mode's floor), and the control's median step."""
    small = df[(df.P < control) & df.step_ms.notna()]
    if small.empty:
        return ["No one-chunk step below the control."]
    floor = float(np.percentile(small.step_ms, 10))
    minute = ((df.t - df.t.min()) // 60).astype(int)
    lines = [f"Slow: a one-chunk step over {slow_over_p10} x their p10 ({floor:.1f} ms).", "",
             f"| minute | one-chunk steps | slow share | P = {control} step p50 (ms) |", "|---|---|---|---|"]
    for m in sorted(minute.unique()):
        part = df[minute == m]
        s = part[(part.P < control) & part.step_ms.notna()]
        big = part[part.P == control].step_ms.dropna()
        share = f"{(s.step_ms > slow_over_p10 * floor).mean():.0%}" if len(s) else "-"
        control_p50 = f"{big.median():.1f}" if len(big) else "-"
        lines.append(f"| {m} | {len(s)} | {share} | {control_p50} |")
    return lines


def verdict(levels: pd.DataFrame, probe: Sequence[float] | np.ndarray, control: int) -> tuple[str, list[str]]:
    """The plan's reading, fixed before the run, over `levels.csv` (ratio, launch_us per repetition)."""
    paired = levels.dropna(subset=["launch_us"])
    eager = paired[(paired.chunks == 1) & (paired.P < control)]
    ctrl = paired[paired.P == control]
    if len(eager) < 3 or eager.launch_us.nunique() < 2:
        return "no pairing", ["No repetition below the control was paired with the launch probe."]
    fast, slow = eager[eager.ratio < FAST], eager[eager.ratio > SLOW]
    r = float(eager.ratio.corr(eager.launch_us))
    r_ctrl = float(ctrl.ratio.corr(ctrl.launch_us)) if len(ctrl) > 2 else float("nan")
    times = (slow.launch_us.mean() / fast.launch_us.mean()) if len(fast) and len(slow) else float("nan")
    spread = float(np.percentile(probe, 90) / np.percentile(probe, 10)) if len(probe) > 2 else float("nan")
    lines = [f"- one-chunk repetitions below P = {control}: {len(eager)}; "
             f"fast (< {FAST}) {len(fast) / len(eager):.0%}, slow (> {SLOW}) {len(slow) / len(eager):.0%}",
             f"- `launch_us`: slow / fast {times:.2f} ×; Pearson r(level, launch_us) {r:+.2f}; the control's "
             f"(P = {control}) {r_ctrl:+.2f}",
             f"- the probe's own samples: {len(probe)}, p90 / p10 {spread:.2f}"]
    both = min(len(fast), len(slow)) >= 0.1 * len(eager)
    if times >= 1.3 and r >= 0.5 and not abs(r_ctrl) >= 0.3:
        return "the launch path sets the level", lines
    if both and abs(r) < 0.2 and times < 1.3:
        return "the engine's own (not the host's launch path)", lines
    if not both:
        return "inconclusive (one level held the run)", lines
    return "none of the plan's readings", lines


def nearest_probe(df: pd.DataFrame, probe_t: np.ndarray, probe_v: np.ndarray, control: int) -> list[str]:
    """r(step ratio, the probe's nearest sample) where that sample is within `dt` of the injection."""
    if not len(probe_t):
        return ["No probe samples."]
    i = np.abs(probe_t[None, :] - df.t.to_numpy()[:, None]).argmin(axis=1)
    dt, value = np.abs(probe_t[i] - df.t.to_numpy()), probe_v[i]
    lines = []
    for lim in (0.15, 0.3):
        for label, keep in ((f"P < {control}", df.P < control), (f"P = {control}", df.P == control)):
            m = (dt < lim) & keep.to_numpy() & df.step_ratio.notna().to_numpy()
            if m.sum() > 5:
                r = np.corrcoef(df.step_ratio[m], value[m])[0, 1]
                lines.append(f"- |dt| < {lim} s, {label}: r(chunk step ratio, launch) {r:+.2f} over {m.sum()}")
    lag = np.corrcoef(probe_v[:-1], probe_v[1:])[0, 1] if len(probe_v) > 3 else float("nan")
    lines.append(f"- the probe's lag-1 autocorrelation (one interval apart): {lag:+.2f}")
    return lines


def block_state(df: pd.DataFrame, control: int) -> pd.DataFrame:
    """Per block with both kinds of prompt: its span and the mean chunk-step ratio of the prompts below the control
    (`small`) and of the control (`big`)."""
    rows = []
    for b, g in df.dropna(subset=["step_ratio"]).groupby("block"):
        small, big = g[g.P < control], g[g.P == control]
        if len(small) and len(big):
            rows.append({"block": b, "t0": g.t.min(), "t1": g.t.max() + 0.1,
                         "small": small.step_ratio.mean(), "big": big.step_ratio.mean(),
                         "pre": g.pre_ratio.mean() if "pre_ratio" in g else np.nan})
    return pd.DataFrame(rows)


def block_lines(blocks: pd.DataFrame, gpu: pd.DataFrame, control: int) -> list[str]:
    if len(blocks) < 5:
        return ["Fewer than five blocks hold both kinds of prompt."]
    q = np.percentile(blocks.small, [10, 50, 90])
    qb = np.percentile(blocks.big, [10, 50, 90])
    lines = [f"- {len(blocks)} blocks; r(block's P < {control} step ratio, its P = {control}'s) "
             f"**{blocks.small.corr(blocks.big):+.2f}**",
             f"- the block's P < {control} ratio p10 / p50 / p90 {q[0]:.2f} / {q[1]:.2f} / {q[2]:.2f}; "
             f"P = {control}'s {qb[0]:.2f} / {qb[1]:.2f} / {qb[2]:.2f}",
             f"- lag-1 autocorrelation from block to block: P < {control} {blocks.small.autocorr(1):+.2f}, "
             f"P = {control} {blocks.big.autocorr(1):+.2f}"]
    if "pre" in blocks and blocks.pre.notna().sum() > 4:
        q = np.nanpercentile(blocks.pre, [10, 90])
        lines.append(f"- the decode step before the injections (the probes' TPOT p50 over its configuration's median), "
                     f"block mean p10 / p90 {q[0]:.3f} / {q[1]:.3f}: r with P < {control} "
                     f"{blocks.small.corr(blocks.pre):+.2f}")
    if len(gpu):
        feats = defaultdict(list)
        for b in blocks.itertuples():
            g = gpu[(gpu.t >= b.t0) & (gpu.t <= b.t1)]
            feats["power_w"].append(g.power_w.mean() if len(g) else np.nan)
            feats["power_cap"].append(g.cap.mean() if len(g) else np.nan)
            feats["sm_mhz"].append(g.sm_mhz.mean() if len(g) else np.nan)
        for key, vals in feats.items():
            v = pd.Series(vals)
            lines.append(f"- the block's {key} (mean {v.mean():.2f}): r with P < {control} "
                         f"{blocks.small.corr(v):+.2f}, with P = {control} {blocks.big.corr(v):+.2f}")
    return lines


def monitor(tgz: Path) -> tuple[np.ndarray, np.ndarray, pd.DataFrame]:
    """The launch probe's samples (s, µs a launch) and nvidia-smi's rows (s, SM MHz, W, power cap) on the
    records' clock, from a sweep's `host-monitor.tgz` (one machine)."""
    empty = pd.DataFrame(columns=["t", "sm_mhz", "power_w", "cap"])
    if not tgz.exists():
        return np.array([]), np.array([]), empty
    with tempfile.TemporaryDirectory() as tmp:
        with tarfile.open(tgz) as tar:  # the data filter where this Python has it (3.11.4 and later)
            tar.extractall(tmp, **({"filter": "data"} if hasattr(tarfile, "data_filter") else {}))
        folder = next((p.parent for p in Path(tmp).rglob("host-*.jsonl")), Path(tmp))
        machines = host_levels.load_monitor(folder)
        launches = host_levels.load_launches(folder, list(machines))
    pt, pv = next(iter(launches.values()), ([], []))
    gpu = [row for _, _, rows in machines.values() for row in rows]
    frame = pd.DataFrame([{"t": t / 1e9, "sm_mhz": mhz, "power_w": w, "cap": bool(r & POWER_CAP)}
                          for t, mhz, w, r in gpu]) if gpu else empty
    return np.asarray(pt, dtype=float) / 1e9, np.asarray(pv, dtype=float), frame


def report(results: Path, control: int | None, windows: Path | None = None) -> str:
    df = repetitions(results)
    left_out = ""
    if windows is not None:
        kept = outside_windows(df, windows)
        left_out = f" {len(df) - len(kept)} repetitions inside the profiler's windows ({windows.name}) are left out."
        df = with_ratios(kept)
    control = control or int(df.P.max())
    probe_t, probe_v, gpu = monitor(results / "host-monitor.tgz")
    lines = [f"# Where the one-chunk step's level lives: {results.name}", "",
             "`python scripts/eager_levels.py` (its docstring says what each part is). "
             "Chunk steps are the engine's own log's; a block is one repetition of every configuration, "
             "interleaved." + left_out, "",
             "## Per configuration", "", *per_config(df), ""]
    csv = results / "levels.csv"
    if csv.exists():
        name, why = verdict(pd.read_csv(csv), probe_v, control)
        graphs = "cudagraph_capture_sizes" in (results / "sweep.json").read_text() \
            if (results / "sweep.json").exists() else False
        lines += ["## The plan's reading (fixed before the run)", "", *why, "",
                  f"**Verdict: {name}.**" + (" These prompts ran as CUDA-graph steps here (the sweep's "
                                             "capture sizes): a control of the reading, not the eager step's."
                                             if graphs else ""),
                  ""]
    lines += ["## Minute by minute", "", *minutes(df, control), "",
              "## The probe's nearest sample", "", *nearest_probe(df, probe_t, probe_v, control), "",
              "## The block state", "", *block_lines(block_state(df, control), gpu, control), ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("results", type=Path)
    ap.add_argument("--control", type=int, help="the compute-bound control's P (default: the largest P)")
    ap.add_argument("--windows", type=Path, help="profile_window.py's windows.jsonl: leave their repetitions out")
    ap.add_argument("--out", type=Path)
    a = ap.parse_args(argv)
    if a.windows is not None and not a.windows.exists():
        ap.error(f"--windows {a.windows}: no such file")
    text = report(a.results, a.control, a.windows)
    if a.out:
        atomic_write_text(a.out, text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
