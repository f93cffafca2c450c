"""Issues 30, 32 and 36 (GPU session 39): who runs in vLLM's engine core process while its eager steps are slow.

    python scripts/gpu/gil_dumps.py RESULTS_DIR [--out gil.md]

Reads what `scripts/gpu/gil-dumps.sh` leaves: `dumps.txt.gz` (py-spy's non-blocking dumps of the engine core, each
after an `@@ <epoch s>` line), the sweep's records (`{chunk}/D*_P*.json` and their `raw/` windows, read as
`scripts/eager_levels.py` reads them) and `monitor.tgz` (the host monitor's samples carry both the monotonic clock the
records use and the wall clock the dumps use: their difference puts the dumps on the records' clock). Writes:

1. the dumps: taken, readable (a non-blocking dump that races the interpreter fails), their cadence;
2. every thread's states over the readable dumps (idle / active / active+gil: py-spy's, "active" = on a CPU or
   runnable by the OS, "gil" = it holds the GIL);
3. **inside the one-chunk eager steps**: the dumps taken between a one-chunk prefill's injection and its first
   token, split by the step's level (the engine's own log's step over its configuration's median: slow > 1.1,
   fast < 0.9): the main thread's state, whether another thread holds the GIL or is active, the main thread's
   innermost frame;
4. **the state over seconds**: per 2 s, the one-chunk steps' mean level against the share of dumps in which the
   main thread runs without the GIL, another thread holds it, or another thread is active;
5. **the main thread as the guest sees it** (the host monitor's /proc samples of the engine core's main thread, every
   0.1 s): its run-queue wait share and its vCPU at each one-chunk repetition against the level, its stays on one
   vCPU (the level within each), and the monitor's own fixed loop (`spin`). Where there are no dumps (a profiled
   engine of `step-anatomy.sh`: its `thread.md`) this part alone;
6. **the main thread's counters** where `counters.jsonl.gz` is (`scripts/gpu/thread_counters.py`): per 2 s, against
   the one-chunk steps' mean level, the clock (cycles over reference cycles), the hardware's share of the guest's
   running time (reference cycles a task-clock second: a vCPU the host deschedules while the guest counts it running
   shows here) and the instructions a cycle, slow bins against fast, and the reading fixed before the run
   (`COUNTER_RULES`).

Pure arithmetic on committed files.
"""

from __future__ import annotations

import argparse
import gzip
import json
import re
import sys
import tarfile
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))
sys.path.insert(0, str(ROOT))

from eager_levels import repetitions  # noqa: E402

from pdexporter._internal.atomic import atomic_write_text  # noqa: E402

SLOW, FAST = 1.1, 0.9
_THREAD = re.compile(r'^Thread (\d+) \(([a-z+]+)\): "(.*)"$')
_FRAME = re.compile(r"^\s+(\S.*) \((.*)\)$")


@dataclass
class Thread:
    name: str
    state: str  # idle | active | active+gil | (py-spy's other spellings, kept as given)
    frames: list[str] = field(default_factory=list)  # innermost first: "function (file:line)"

    @property
    def gil(self) -> bool:
        return "gil" in self.state

    @property
    def active(self) -> bool:
        return self.state.startswith("active")


@dataclass
class Dump:
    epoch: float
    threads: list[Thread]

    @property
    def ok(self) -> bool:
        return bool(self.threads)

    @property
    def main(self) -> Thread | None:
        return next((t for t in self.threads if t.name == "MainThread"), None)

    def others(self) -> list[Thread]:
        return [t for t in self.threads if t.name != "MainThread"]


def parse_dumps(text: str) -> list[Dump]:
    """Every `@@ <epoch>` block of gil-dumps.sh's file; a block with an error or no thread is kept with none."""
    dumps: list[Dump] = []
    failed = False
    for line in text.splitlines():
        if line.startswith("@@ "):
            dumps.append(Dump(float(line[3:]), []))
            failed = False
            continue
        if not dumps or failed:
            continue
        if line.startswith("Error"):
            dumps[-1].threads.clear()
            failed = True
        elif m := _THREAD.match(line):
            dumps[-1].threads.append(Thread(m.group(3), m.group(2)))
        elif (m := _FRAME.match(line)) and dumps[-1].threads:
            dumps[-1].threads[-1].frames.append(f"{m.group(1)} ({m.group(2)})")
    return dumps


def monitor_rows(monitor_tgz: Path) -> Iterator[dict[str, Any]]:
    """Every sample line of the host monitor's files in `monitor_tgz` (scripts/gpu/host_monitor.py's form)."""
    with tarfile.open(monitor_tgz) as tar:
        for member in tar.getmembers():
            if member.name.endswith(".jsonl") and (f := tar.extractfile(member)) is not None:
                for line in f.read().decode().splitlines():
                    yield json.loads(line)


def clock_offset(monitor_tgz: Path) -> float:
    """Wall minus monotonic seconds, the median over the host monitor's samples (`t` monotonic ns, `w` wall ns)."""
    diffs = [(row["w"] - row["t"]) / 1e9 for row in monitor_rows(monitor_tgz) if "t" in row and "w" in row]
    if not diffs:
        raise SystemExit(f"{monitor_tgz}: no host-monitor sample with both clocks (t, w)")
    return float(np.median(diffs))


def dump_frame(dumps: list[Dump], offset: float) -> pd.DataFrame:
    """One row per readable dump on the records' clock: the main thread's state and innermost frame, and the others'."""
    rows = []
    for d in dumps:
        main = d.main
        if main is None:
            continue
        others = d.others()
        rows.append({"t": d.epoch - offset, "main_state": main.state,
                     "main_where": main.frames[0] if main.frames else "",
                     "main_running_no_gil": main.state == "active",
                     "other_gil": any(t.gil for t in others),
                     "other_active": any(t.active for t in others)})
    return pd.DataFrame(rows)


def one_chunk(reps: pd.DataFrame, control: int) -> pd.DataFrame:
    """The repetitions of the one-chunk prompts (P below the compute-bound control) the engine's log timed."""
    return reps[(reps.P < control) & reps.step_ratio.notna()]


def _bin(t: pd.Series, t0: float, width: float) -> pd.Series:
    return ((t - t0) // width).astype(int)


def _share(s: pd.Series) -> str:
    return f"{100 * s.mean():.0f}%" if len(s) else "—"


def thread_states(dumps: list[Dump]) -> list[str]:
    counts: dict[str, Counter[str]] = {}
    for d in dumps:
        for t in d.threads:
            counts.setdefault(t.name, Counter())[t.state] += 1
    lines = ["| thread | dumps | idle | active (no GIL) | active + GIL |", "|---|---|---|---|---|"]
    for name, c in sorted(counts.items(), key=lambda kv: -sum(kv[1].values())):
        n = sum(c.values())
        lines.append(f"| {name} | {n} | {100 * c['idle'] / n:.1f}% | {100 * c['active'] / n:.1f}% | "
                     f"{100 * c['active+gil'] / n:.1f}% |")
    return lines


def in_steps(frame: pd.DataFrame, reps: pd.DataFrame, control: int) -> pd.DataFrame:
    """The dumps taken inside a one-chunk prefill's step window (its injection to its first token), with the step's
    level (`step_ratio`)."""
    one = one_chunk(reps, control)
    t = frame.t.to_numpy()
    rows = []
    for r in one.itertuples():
        hit = np.flatnonzero((t >= r.t) & (t <= r.t + r.first_s))
        for i in hit:
            rows.append({**frame.iloc[i].to_dict(), "step_ratio": r.step_ratio, "P": r.P, "D": r.D})
    return pd.DataFrame(rows)


def level_table(inside: pd.DataFrame) -> list[str]:
    if inside.empty:
        return ["No readable dump fell inside a one-chunk step."]
    groups = {"slow (> 1.1)": inside[inside.step_ratio > SLOW], "fast (< 0.9)": inside[inside.step_ratio < FAST],
              "all": inside}
    lines = ["| steps | dumps | main: active + GIL | main: active, no GIL | main: idle | another holds the GIL | "
             "another active |", "|---|---|---|---|---|---|---|"]
    for name, g in groups.items():
        lines.append(f"| {name} | {len(g)} | {_share(g.main_state == 'active+gil')} | "
                     f"{_share(g.main_running_no_gil)} | {_share(g.main_state == 'idle')} | "
                     f"{_share(g.other_gil)} | {_share(g.other_active)} |")
    lines += ["", "The main thread's innermost frame (the eight most common here; share of each group):", "",
              "| frame | slow | fast |", "|---|---|---|"]
    slow, fast = groups["slow (> 1.1)"], groups["fast (< 0.9)"]
    for where, _ in Counter(inside.main_where).most_common(8):
        lines.append(f"| `{where}` | {_share(slow.main_where == where)} | {_share(fast.main_where == where)} |")
    return lines


def state_lines(frame: pd.DataFrame, reps: pd.DataFrame, control: int, width: float = 2.0) -> list[str]:
    one = one_chunk(reps, control)
    if one.empty or frame.empty:
        return ["No one-chunk step or no readable dump."]
    t0 = min(frame.t.min(), one.t.min())
    fb = frame.assign(bin=_bin(frame.t, t0, width)).groupby("bin")
    sb = one.assign(bin=_bin(one.t, t0, width)).groupby("bin").step_ratio.mean()
    feats = pd.DataFrame({"no_gil": fb.main_running_no_gil.mean(), "other_gil": fb.other_gil.mean(),
                          "other_active": fb.other_active.mean(), "n": fb.size()})
    both = feats.join(sb, how="inner")
    both = both[both.n >= 5]
    if len(both) < 5:
        return [f"Fewer than five {width:g}-s bins hold both a one-chunk step and five dumps."]
    slow, fast = both[both.step_ratio > SLOW], both[both.step_ratio < FAST]
    lines = [f"{len(both)} bins of {width:g} s (each with ≥ 5 readable dumps and a one-chunk step); "
             f"{len(slow)} slow (mean level > 1.1), {len(fast)} fast (< 0.9).", "",
             "| share of the bin's dumps | r with the bin's mean one-chunk level | slow bins (mean) | "
             "fast bins (mean) |",
             "|---|---|---|---|"]
    for key, label in (("no_gil", "main thread active without the GIL"), ("other_gil", "another thread holds the GIL"),
                       ("other_active", "another thread active")):
        lines.append(f"| {label} | {both.step_ratio.corr(both[key]):+.2f} | {_share(slow[key]) if len(slow) else '—'} "
                     f"| {_share(fast[key]) if len(fast) else '—'} |")
    return lines


def main_thread(monitor_tgz: Path) -> pd.DataFrame:
    """The engine core's main thread (pid = tid, comm `VLLM::EngineCor`) per host-monitor sample: the records' clock
    (s), its vCPU, its share of the interval since the last sample spent running and waiting on the run queue."""
    rows = []
    for row in monitor_rows(monitor_tgz):
        spin = row.get("spin") or [np.nan, -1]
        for key, v in row.get("thr", {}).items():
            pid, tid = key.split("/")
            if pid == tid and "EngineCor" in v[0]:
                rows.append((row["t"] / 1e9, int(v[1]), v[2], v[3], spin[0] / 1e6))
    th = pd.DataFrame(rows, columns=["t", "cpu", "run_ns", "wait_ns", "spin_ms"]).sort_values("t", ignore_index=True)
    dt = th.t.diff()
    return th.assign(wait_share=th.wait_ns.diff() / 1e9 / dt, run_share=th.run_ns.diff() / 1e9 / dt)


def thread_lines(monitor_tgz: Path, reps: pd.DataFrame, control: int, min_stay: int = 6) -> list[str]:
    th = main_thread(monitor_tgz)
    one = one_chunk(reps, control)
    if len(th) < 2 or one.empty:
        return [f"{monitor_tgz.name}: no sample of the engine core's main thread, or no one-chunk step."]
    i = np.clip(np.searchsorted(th.t.to_numpy(), one.t.to_numpy()), 1, len(th) - 1)
    j = one.assign(cpu=th.cpu.to_numpy()[i], wait_share=th.wait_share.to_numpy()[i],
                   spin_ms=th.spin_ms.to_numpy()[i])
    q = np.nanpercentile(j.wait_share, [50, 90])
    lines = [f"- {len(th)} samples of the main thread; at the {len(j)} one-chunk repetitions its run-queue wait share "
             f"p50 / p90 {q[0]:.3f} / {q[1]:.3f}, r with the level {j.step_ratio.corr(j.wait_share):+.2f}",
             "- the monitor's fixed loop (`spin`, its own process): r with the level "
             f"{j.step_ratio.corr(j.spin_ms):+.2f}",
             "", f"The main thread's stays on one vCPU (≥ {min_stay} one-chunk repetitions), in time order:", "",
             "| vCPU | from (s) | to (s) | repetitions | level p50 | slow share |", "|---|---|---|---|---|---|"]
    stay = (j.cpu != j.cpu.shift()).cumsum()
    t0 = j.t.min()
    for _, g in j.groupby(stay):
        if len(g) >= min_stay:
            lines.append(f"| {g.cpu.iloc[0]} | {g.t.min() - t0:.0f} | {g.t.max() - t0:.0f} | {len(g)} | "
                         f"{g.step_ratio.median():.2f} | {_share(g.step_ratio > SLOW)} |")
    return lines


# The reading of the counters, fixed before the run that has them (slow bins' median over fast bins'): the first rule
# that holds names the cause.
COUNTER_RULES = (
    ("on_cpu", 0.8, "the host: the vCPU not running the thread while the guest counts it running"),
    ("clock", 0.8, "a lower clock"),
    ("ipc", 0.8, "fewer instructions a cycle: the physical core shared (a sibling hyperthread, its caches)"),
)


def counters(path: Path) -> tuple[dict[str, Any], pd.DataFrame]:
    """thread_counters.py's file: its header and one row per interval between samples, on the records' clock (`t`,
    s, the interval's end): `busy` (task-clock over wall), and where the hardware counters are, `clock` (cycles a
    reference cycle), `on_cpu` (reference cycles a task-clock ns) and `ipc`."""
    lines = gzip.decompress(path.read_bytes()).decode().splitlines() if path.suffix == ".gz" \
        else path.read_text().splitlines()
    if not lines:
        raise SystemExit(f"{path}: empty")
    header = json.loads(lines[0])
    rows = pd.DataFrame([json.loads(x) for x in lines[1:] if x.strip()])
    if rows.empty:
        return header, rows
    d = rows.diff().iloc[1:]
    out = pd.DataFrame({"t": rows.t.iloc[1:] / 1e9, "busy": d.task_ns / d.t})
    if {"cycles", "ref_cycles", "instructions"} <= set(rows):
        out = out.assign(clock=d.cycles / d.ref_cycles, on_cpu=d.ref_cycles / d.task_ns,
                         ipc=d.instructions / d.cycles)
    return header, out[out.busy > 0.05]  # intervals the thread ran in


def counter_lines(path: Path, reps: pd.DataFrame, control: int, width: float = 2.0) -> list[str]:
    header, rows = counters(path)
    missing = {k: v for k, v in (header.get("available") or {}).items() if v is not True}
    if "clock" not in rows:
        return [f"The guest gave no hardware counter ({', '.join(f'{k}: {v}' for k, v in missing.items())}): "
                "the clock and the instructions a cycle cannot be read here; task-clock alone says nothing new."]
    one = one_chunk(reps, control)
    t0 = min(rows.t.min(), one.t.min())
    feats = rows.assign(bin=_bin(rows.t, t0, width)).groupby("bin")[["clock", "on_cpu", "ipc", "busy"]]
    level = one.assign(bin=_bin(one.t, t0, width)).groupby("bin").step_ratio.mean()
    both = feats.median().join(level, how="inner")
    slow, fast = both[both.step_ratio > SLOW], both[both.step_ratio < FAST]
    if len(slow) < 3 or len(fast) < 3:
        return [f"Fewer than three slow or fast {width:g}-s bins ({len(slow)} slow, {len(fast)} fast)."]
    lines = [f"{len(both)} bins of {width:g} s; {len(slow)} slow, {len(fast)} fast.", "",
             "| quantity | slow bins (median) | fast bins (median) | slow / fast | r with the level |",
             "|---|---|---|---|---|"]
    ratio = {}
    for key in ("clock", "on_cpu", "ipc", "busy"):
        ratio[key] = float(slow[key].median() / fast[key].median())
        lines.append(f"| {key} | {slow[key].median():.3g} | {fast[key].median():.3g} | {ratio[key]:.2f} | "
                     f"{both.step_ratio.corr(both[key]):+.2f} |")
    cause = next((name for key, limit, name in COUNTER_RULES if ratio[key] <= limit), "inconclusive: none of the "
                 "three moved by 20 % between the states")
    return [*lines, "", f"**Reading (fixed before the run): {cause}.**"]


def report(results: Path) -> str:
    reps = repetitions(results)
    control = int(reps.P.max())
    guest = ["## The main thread as the guest sees it", "", *thread_lines(results / "monitor.tgz", reps, control), ""]
    if (results / "counters.jsonl.gz").exists():
        guest += ["## The main thread's counters", "", *counter_lines(results / "counters.jsonl.gz", reps, control),
                  ""]
    dumps_path = results / "dumps.txt.gz"
    if not dumps_path.exists():
        return "\n".join([f"# The engine core's main thread while its eager steps are slow: {results.name}", "",
                          "`python scripts/gpu/gil_dumps.py` (its docstring says what each part is). No py-spy dumps "
                          "here: the host monitor's part alone.", "", *guest])
    dumps = parse_dumps(gzip.decompress(dumps_path.read_bytes()).decode(errors="replace"))
    ok = [d for d in dumps if d.ok]
    if not ok:
        raise SystemExit(f"{dumps_path}: no readable dump among {len(dumps)}")
    offset = clock_offset(results / "monitor.tgz")
    frame = dump_frame(ok, offset)
    gaps = np.diff([d.epoch for d in dumps])
    inside = in_steps(frame, reps, control)
    return "\n".join([
        f"# Inside the engine core process while its eager steps are slow: {results.name}", "",
        "`python scripts/gpu/gil_dumps.py` (its docstring says what each part is). py-spy 0.4.3, `dump --nonblocking`.",
        "", "## The dumps", "",
        f"- {len(dumps)} taken, {len(ok)} readable ({100 * len(ok) / len(dumps):.0f}%), one every "
        f"{1000 * float(np.median(gaps)):.0f} ms (median); {len(frame)} with the main thread",
        f"- on the records' clock (wall − monotonic {offset:.3f} s, from the host monitor); "
        f"{len(reps)} repetitions, the one-chunk ones (P < {control}) with the engine's step in its log: "
        f"{len(one_chunk(reps, control))}", "",
        "## Every thread's states", "", *thread_states(ok), "",
        "## Inside the one-chunk eager steps", "",
        "Dumps between a one-chunk prefill's injection and its first token, by the step's level.", "",
        *level_table(inside), "",
        "## The state over seconds", "", *state_lines(frame, reps, control), "", *guest])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("results", type=Path)
    ap.add_argument("--out", type=Path)
    a = ap.parse_args(argv)
    text = report(a.results)
    if a.out:
        atomic_write_text(a.out, text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
