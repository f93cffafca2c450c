"""Tables and plots of the second GPU session (fast vs faithful, the launch-bound steps, CUDA
graphs, --enforce-eager), read from the records under results/h200-vllm0.22-qwen3-coder-30b-a3b/experiments.

    python scripts/gpu/session2_report.py [RESULTS_DIR]

Prints the markdown tables EXPERIMENTS.md quotes and writes experiments/plots/*.png.
"""

from __future__ import annotations

import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402

from pdexporter.measure.store import ResultsStore  # noqa: E402

ROOT = Path(sys.argv[1] if len(sys.argv) > 1 else "results/h200-vllm0.22-qwen3-coder-30b-a3b")
EXP = ROOT / "experiments"


def reps_of(run_dir: Path, run: str) -> pd.DataFrame:
    """One row per repetition of every record in a results directory."""
    rows = []
    store = ResultsStore(run_dir)
    for record in store.iter_records():
        c = record.config
        for rep in record.reps or []:
            raw = store.load_raw(store.chunk_dir(c.chunk_size) / rep.raw)
            rows.append({
                "run": run, "B": c.chunk_size, "D": c.decode_batch_size, "P": c.new_prefill_tokens, "rep": rep.rep,
                "t_s": raw.get("t_inject_clock_ns", 0) / 1e9,
                "penalty": rep.derived.tpot_penalty_p50_ms,
                "prefill": rep.interference.prefill_duration_ms,
                "during": rep.interference.tpot_during_prefill_p50_ms,
                "first_step": (rep.interference.chunk_step_times_ms or [float("nan")])[0],
            })
    return pd.DataFrame(rows)


def rel(a: pd.Series, b: pd.Series) -> pd.Series:
    return (a - b).abs() / b * 100


def modes_table() -> None:
    runs = {name: reps_of(EXP / "modes" / name, name) for name in ("fastA", "faithful", "faithful0", "fastB")}
    med = {k: v.groupby(["D", "P"])[["penalty", "prefill", "during"]].median() for k, v in runs.items()}
    print("\n## fast vs faithful (B=8192, medians of 5 repetitions)\n")
    print("| D | P | penalty: fast A / faithful 5 s / faithful 0 s / fast B (ms) | prefill_duration: same order (ms) |")
    print("|---|---|---|---|")
    for (d, p) in med["faithful"].index:
        pen = " / ".join(f"{med[k].loc[(d, p), 'penalty']:.1f}" for k in runs)
        pre = " / ".join(f"{med[k].loc[(d, p), 'prefill']:.1f}" for k in runs)
        print(f"| {d} | {p} | {pen} | {pre} |")
    print("\nmedian |difference| in % over the configurations (P=1024 launch-bound / P>=8192):\n")
    print("| pair | penalty P=1024 | penalty P>=8192 | prefill P=1024 | prefill P>=8192 |")
    print("|---|---|---|---|---|")
    for a, b in (("fastA", "faithful"), ("fastB", "faithful"), ("faithful0", "faithful"), ("fastA", "fastB")):
        cells = []
        for metric in ("penalty", "prefill"):
            r = rel(med[a][metric], med[b][metric])
            small = r[r.index.get_level_values("P") == 1024]
            big = r[r.index.get_level_values("P") >= 8192]
            cells += [f"{small.median():.1f}", f"{big.median():.1f}"]
        print(f"| {a} vs {b} | {cells[0]} | {cells[2]} | {cells[1]} | {cells[3]} |")


def launch_plot() -> pd.DataFrame:
    frames = [reps_of(EXP / "modes" / n, n) for n in ("fastA", "faithful", "faithful0", "fastB")]
    frames += [reps_of(EXP / "launch" / n, n) for n in ("launch", "launch-pinned", "launch-again", "long")]
    df = pd.concat(frames)
    df = df[(df.P <= 2048) & (df.first_step < 500)].copy()
    df["t_s"] -= df.t_s.min()
    graphs = reps_of(EXP / "graphs", "graphs")
    g8 = graphs[graphs.B == 8192]
    fig, ax = plt.subplots(figsize=(11, 4.2))
    for run, part in df.groupby("run", sort=False):
        ax.scatter(part.t_s, part.first_step, s=9, label=run)
    ax.axhspan(g8.first_step.min(), g8.first_step.max(), color="green", alpha=0.15,
               label="same configurations, CUDA graphs to 2560 tokens (fresh engine)")
    ax.set_xlabel("seconds since the first repetition (one vLLM engine, B=8192)")
    ax.set_ylabel("the prefill's step, seen by the decodes (ms)")
    ax.set_title("H200, vLLM 0.22: a prefill of 512-2048 tokens beside 1-12 decodes, every repetition in order")
    ax.legend(fontsize=7, ncol=3, loc="upper left")
    ax.set_ylim(0, 120)
    out = EXP / "plots"
    out.mkdir(exist_ok=True)
    fig.tight_layout()
    fig.savefig(out / "launch-bound-steps.png", dpi=120)
    print(f"\nwrote {out / 'launch-bound-steps.png'}")
    print("\n## launch-bound steps per run (B=8192, P<=2048, ms)\n")
    print("| run | reps | median | p10 | p90 |")
    print("|---|---|---|---|---|")
    for run, part in df.groupby("run", sort=False):
        s = part.first_step
        print(f"| {run} | {len(s)} | {s.median():.1f} | {s.quantile(0.1):.1f} | {s.quantile(0.9):.1f} |")
    return df


def graphs_table(launch: pd.DataFrame) -> None:
    graphs = reps_of(EXP / "graphs", "graphs")
    main = pd.concat([reps_of(ROOT, "sweep")])
    print("\n## CUDA graphs for mixed steps (piecewise, up to 2560 tokens at B=8192, 2048 at B=2048)\n")
    print(
        "| B | D | P | penalty ms: graphs / without (this session) / without (sweep) | prefill_duration ms: same order "
        "| TPOT during ms: same order |"
    )
    print("|---|---|---|---|---|---|")
    for (b, d, p), g in graphs.groupby(["B", "D", "P"]):
        same = launch[(launch.D == d) & (launch.P == p)] if b == 8192 else launch.iloc[0:0]
        sw = main[(main.B == b) & (main.D == d) & (main.P == p)]
        cells = []
        for metric in ("penalty", "prefill", "during"):
            this = f"{same[metric].median():.1f}" if len(same) else "–"
            cells.append(f"{g[metric].median():.1f} / {this} / {sw[metric].median():.1f}")
        print(f"| {b} | {d} | {p} | " + " | ".join(cells) + " |")


def eager_table() -> None:
    eager = pd.concat([reps_of(EXP / "eager" / part, "eager") for part in ("d4", "d1")])
    default = pd.concat([reps_of(EXP / "modes" / n, n) for n in ("fastA", "faithful", "faithful0", "fastB")])
    default["ratio"] = default.penalty / (default.during - default.penalty)
    eager["ratio"] = eager.penalty / (eager.during - eager.penalty)
    print("\n## --enforce-eager vs default (B=8192, medians)\n")
    print("| D | P | baseline TPOT ms | penalty ms | penalty ratio | prefill_duration ms |")
    print("|---|---|---|---|---|---|")
    for (d, p), e in eager.groupby(["D", "P"], sort=False):
        g = default[(default.D == d) & (default.P == p)]
        cells = [f"{(e.during - e.penalty).median():.1f} / {(g.during - g.penalty).median():.1f}"]
        cells += [
            f"{e[m].median():.{2 if m == 'ratio' else 1}f} / {g[m].median():.1f}"
            for m in ("penalty", "ratio", "prefill")
        ]
        print(f"| {d} | {p} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    modes_table()
    launch = launch_plot()
    graphs_table(launch)
    eager_table()
