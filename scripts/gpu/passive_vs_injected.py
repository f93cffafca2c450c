"""Passive mode against injection on one engine: measure the cells a passive run filled by injection,
then compare them (issue 17). Run by scripts/gpu/passive-h200.sh; works against any engine.

    python3 scripts/gpu/passive_vs_injected.py PASSIVE_DIR --target URL --out INJECTED_DIR \
        [--min-events 5] [--cells 12] [--reps 3] [--deadline SECONDS] [--report DIR]

1. The passive records (`pdexporter run --passive --out PASSIVE_DIR`: one repetition per production
   prefill, cells binned) are read; the cells with at least --min-events events, most events first,
   at most --cells of them, are the ones compared.
2. Each is measured by injection on the same engine (`pdexporter measure -B -D -P --reps`, faithful:
   Phase 1, then a cold P-token prefill beside D fresh probe streams), skipping cells already in
   INJECTED_DIR and stopping before --deadline (seconds from now): a later call goes on.
3. Per cell: the passive median with its bootstrap 95 % interval, the injected value, the error, and
   the minutes of traffic (the passive events' started_at) after which the passive running median
   stayed within 10 % of the injected value, for the TPOT penalty and the interference per decode
   stream (D times it is the aggregate; a passive event's D is its own, its cell's is a bin). Written
   to REPORT/comparison.md and comparison.json, and printed.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from pdexporter._internal.durations import iso_epoch_s  # noqa: E402
from pdexporter.analysis.passive import compare_cells  # noqa: E402
from pdexporter.measure.store import ResultsStore, load_record_file  # noqa: E402

COLUMNS = (("tpot_penalty_p50_ms", "TPOT penalty"), ("total_interference_ms", "interference per decode stream"))


def passive_cells(root: Path) -> dict:  # type: ignore[type-arg]
    cells = {}
    for path in ResultsStore(root).iter_record_paths():
        record = load_record_file(path)
        if record.config.mode == "passive":
            cells[record.key] = record
    return cells


def measure(cells: list, target: str, out: Path, reps: int, deadline: float, model: str | None) -> None:  # type: ignore[type-arg]
    store = ResultsStore(out)
    for b, d, p in cells:
        done = store.load_record(b, d, p)
        if done is not None and len(done.reps) >= reps:
            continue
        if time.monotonic() > deadline - 60:
            print(f"deadline: B={b} D={d} P={p} and later cells left for the next call", flush=True)
            return
        cmd = [sys.executable, "-m", "pdexporter", "measure", "-B", str(b), "-D", str(d), "-P", str(p),
               "--reps", str(reps), "--target", target, "--out", str(out)] + (["--model", model] if model else [])
        print(f"injected: B={b} D={d} P={p}", flush=True)
        subprocess.run(cmd, check=False, timeout=max(60, deadline - time.monotonic()))


def compare(passive: dict, injected_dir: Path, keys: list) -> list[dict]:  # type: ignore[type-arg]
    store = ResultsStore(injected_dir)
    t0 = min((iso_epoch_s(rep.started_at) or 0) for rec in passive.values() for rep in rec.reps) or 0.0
    rows = []
    for field, title in COLUMNS:
        events = {k: [((iso_epoch_s(rep.started_at) or t0) - t0, getattr(rep.derived, field))
                      for rep in passive[k].reps] for k in keys}
        injected = {}
        for k in keys:
            record = store.load_record(*k)
            if record is not None and getattr(record.derived, field) is not None:
                injected[k] = getattr(record.derived, field)
        for c in compare_cells(events, injected, field, tolerance=0.10):
            rows.append(
                {
                    "quantity": title,
                    "chunk_size": c.key[0],
                    "decode_batch_size": c.key[1],
                    "new_prefill_tokens": c.key[2],
                    "events": c.events,
                    "passive_ms": round(c.passive, 3),
                    "ci_low_ms": c.ci_low,
                    "ci_high_ms": c.ci_high,
                    "injected_ms": round(c.injected, 3),
                    "error": None if c.error is None else round(c.error, 4),
                    "minutes_to_10pct": None if c.time_to_tolerance_s is None else round(c.time_to_tolerance_s / 60, 2),
                }
            )
    return rows


def markdown(rows: list[dict], passive: dict) -> str:  # type: ignore[type-arg]
    lines = []
    for title in dict.fromkeys(r["quantity"] for r in rows):
        lines += [
            f"### {title} (ms)",
            "",
            "| B | D | P | events | passive | 95 % CI | injected | error | minutes to 10 % |",
            "|---|---|---|---|---|---|---|---|---|",
        ]
        mine = [r for r in rows if r["quantity"] == title]
        for r in mine:
            ci = "-" if r["ci_low_ms"] is None else f"{r['ci_low_ms']:.1f}-{r['ci_high_ms']:.1f}"
            err = "-" if r["error"] is None else f"{r['error'] * 100:+.1f} %"
            minutes = "-" if r["minutes_to_10pct"] is None else f"{r['minutes_to_10pct']:.1f}"
            lines.append(
                f"| {r['chunk_size']} | {r['decode_batch_size']} | {r['new_prefill_tokens']} | {r['events']} | "
                f"{r['passive_ms']:.1f} | {ci} | {r['injected_ms']:.1f} | {err} | {minutes} |"
            )
        inside = sum(1 for r in mine if r["error"] is not None and abs(r["error"]) <= 0.10)
        lines += ["", f"{inside}/{len(mine)} cells within 10 %.", ""]
    sources: dict[str, int] = {}
    for record in passive.values():
        for rep in record.reps:
            source = (rep.model_extra or {}).get("passive", {}).get("source") or "?"
            sources[source] = sources.get(source, 0) + 1
    lines.append(f"Passive events by source of P: {sources}")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("passive_dir", type=Path)
    parser.add_argument("--target", required=True)
    parser.add_argument("--out", type=Path, required=True, help="injected records go here")
    parser.add_argument("--report", type=Path, default=None, help="comparison.md / .json go here (default: --out)")
    parser.add_argument("--min-events", type=int, default=5)
    parser.add_argument("--cells", type=int, default=12)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--deadline", type=float, default=3600.0)
    parser.add_argument("--model", default=None)
    parser.add_argument("--no-measure", action="store_true", help="compare what is there only")
    args = parser.parse_args()
    deadline = time.monotonic() + args.deadline
    passive = passive_cells(args.passive_dir)
    ranked = sorted(
        (k for k, r in passive.items() if len(r.reps) >= args.min_events), key=lambda k: -len(passive[k].reps)
    )
    keys = sorted(ranked[: args.cells])
    print(f"{len(passive)} passive cells, {sum(len(r.reps) for r in passive.values())} events; comparing {len(keys)} "
          f"with >= {args.min_events} events: {keys}", flush=True)
    if not args.no_measure:
        measure(keys, args.target, args.out, args.reps, deadline, args.model)
    rows = compare(passive, args.out, keys)
    report = args.report or args.out
    report.mkdir(parents=True, exist_ok=True)
    (report / "comparison.json").write_text(json.dumps(rows, indent=1))
    text = markdown(rows, passive)
    (report / "comparison.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
