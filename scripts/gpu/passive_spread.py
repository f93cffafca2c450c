"""The timeline of a spread passive run (`validation.sh passive-spread`, scripts/gpu/passive-h200.sh with
SEGMENTS=K): passive segment k (run --passive + the load) then injected block k (one more repetition of
every cell of the sweep), k = 1..K, on one engine. Relates the injected repetitions to the minutes of the
passive events: per segment its wall span and the passive events that started in it, per block its wall
span and the injected repetitions it recorded (their `block` field, k - 1); then the two checks the step
is for: every injected cell holds K repetitions, one per block, and every segment has events.

    python3 scripts/gpu/passive_spread.py WORK_DIR [--segments K]     # prints markdown, writes spread.json

WORK_DIR holds spread.tsv (passive-h200.sh: `segment|block  k  start_epoch  end_epoch  rc`, one line per
segment and per sweep invocation of a block: a block resumed in a later call has several; `burn  k  start
end  N` where block k ran beside N busy loops), passive/ and injected/. Exit 1 when --segments is given
and a check fails (a dry run's proof); 2, one line, where a segment or block line of spread.tsv does not
read (`passive_compare.spread_timeline`); else 0.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import sys
from collections import Counter
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from pdexporter._internal.durations import iso_epoch_s  # noqa: E402
from pdexporter.analysis import passive_model  # noqa: E402
from pdexporter.analysis.passive_compare import spread_timeline  # noqa: E402
from pdexporter.errors import PdexporterError  # noqa: E402
from pdexporter.measure.store import ResultsStore  # noqa: E402


class Part:
    """A segment or a block: its span, wall time (blocks: summed over their sweep invocations) and,
    for a block, each invocation's exit code. (A plain class: tests load this script by path, where
    a dataclass cannot resolve its module.)"""

    def __init__(self, kind: str, k: int, start: float, end: float) -> None:
        self.kind, self.k, self.start, self.end = kind, k, start, end  # kind: "segment" | "block"
        self.wall_s = 0.0
        self.invocations: list[int] = []


def read_timeline_lines(lines: list[str], source: str = "spread.tsv") -> list[Part]:
    """spread.tsv's lines as one Part per segment and per block (a block's invocations summed)."""
    parts: dict[tuple[str, int], Part] = {}
    for kind, k, start, end, rc in spread_timeline(lines, source):
        part = parts.setdefault((kind, k), Part(kind, k, start, end))
        part.start, part.end = min(part.start, start), max(part.end, end)
        part.wall_s += end - start
        if kind == "block":
            part.invocations.append(rc)
    return sorted(parts.values(), key=lambda p: (p.start, p.kind))


def records_in(root: Path) -> list[Any]:
    """The records of a results directory (none where it is missing): read once, used by every part."""
    return list(ResultsStore(root).iter_records()) if root.is_dir() else []


def passive_starts(records: list[Any]) -> list[float]:
    """The published passive events' start times (one repetition each)."""
    return sorted(t for r in records for rep in r.reps
                  if (t := iso_epoch_s(rep.started_at)) is not None)


def injected_reps(records: list[Any]) -> dict[tuple[int, int, int], list[tuple[int | None, float | None]]]:
    """Per injected cell (B, D, P): its repetitions' (block, start time)."""
    out: dict[tuple[int, int, int], list[tuple[int | None, float | None]]] = {}
    for record in records:
        c = record.config
        out[(c.chunk_size, c.decode_batch_size, c.new_prefill_tokens)] = [
            ((rep.model_extra or {}).get("block"), iso_epoch_s(rep.started_at)) for rep in record.reps]
    return out


def burners(lines: list[str]) -> dict[int, int]:
    """Block k -> the busy loops it ran beside (spread.tsv's `burn k start end N` lines)."""
    out: dict[int, int] = {}
    for line in lines:
        cols = line.split()
        if len(cols) >= 5 and cols[0] == "burn" and cols[1].isdigit() and cols[4].isdigit():
            out[int(cols[1])] = int(cols[4])
    return out


def fisher_greater(a: int, b: int, c: int, d: int) -> float:
    """One-sided Fisher's exact test on [[a, b], [c, d]]: P(the top-left count >= a) with the margins fixed
    (row 1's share of the first column at least as high as observed, by chance)."""
    from scipy.stats import fisher_exact  # here, not at import: the script's other parts need no scipy

    return float(fisher_exact([[a, b], [c, d]], alternative="greater")[1])


def level_lines(passive: list[Any], injected: list[Any], parts: list[Part], burn: dict[int, int],
                ) -> tuple[list[str], dict[str, Any]]:
    """The launch levels by part (module docs), from the passive and the injected records: markdown lines
    and their JSON."""
    records = [r for r in passive if r.config.mode == "passive"]
    events = passive_model.events_from_records(records, origin=0.0)  # at_s: each event's start, epoch s
    if not events:
        return [], {}
    grid = passive_model.Grid(tuple(sorted({e.chunk_size for e in events})))
    levels = passive_model.launch_levels(events, grid)
    if not levels.split:
        return [f"Launch levels: {levels.events} launch-bound one-chunk events, not clearly two levels "
                "(nothing to split by part)."], {"two_levels": False}
    by_cell = passive_model.injected_reps(injected)
    reps = [r for (b, d, p), rs in by_cell.items() if levels.launch_bound(d, p, b) for r in rs]
    read = [(r.at_s, lv) for r in reps if (lv := levels.level_of(r)) is not None]
    seen = [(events[i].at_s, "fast" if i in levels.fast else "slow") for i in sorted(levels.fast | levels.slow)]
    rows, doc, by = [], [], {"burn": [0, 0], "quiet": [0, 0], "segment": [0, 0]}
    for p in parts:
        pool = seen if p.kind == "segment" else read
        lv = [x for t, x in pool if p.start <= t <= p.end]
        fast = lv.count("fast")
        n_burn = burn.get(p.k, 0) if p.kind == "block" else 0
        group = "segment" if p.kind == "segment" else "burn" if n_burn else "quiet"
        by[group][0] += fast
        by[group][1] += len(lv)
        share = f"{100 * fast / len(lv):.0f} %" if lv else "–"
        rows.append(f"| {p.kind} {p.k} | {n_burn or ''} | {fast}/{len(lv)} | {share} |")
        doc.append({"kind": p.kind, "k": p.k, "burners": n_burn, "fast": fast, "read": len(lv)})

    def pct(g: str) -> str:
        f, n = by[g]
        return f"{f}/{n} ({100 * f / n:.0f} %)" if n else "none"

    lines = [
        f"Launch levels by part: the events' two modes (step extra over the baseline {levels.fast_ms:.1f} and "
        f"{levels.slow_ms:.1f} ms, Ashman's D {levels.separation:.1f}); segments: the launch-bound one-chunk "
        "events, blocks: the launch-bound injected repetitions whose chunk step reads.",
        "",
        "| part | busy loops | fast / read | fast share |",
        "|---|---|---|---|",
        *rows,
        "",
        f"Segments {pct('segment')} fast; quiet blocks {pct('quiet')}; blocks beside busy loops {pct('burn')}.",
    ]
    out: dict[str, Any] = {"two_levels": True, "fast_ms": levels.fast_ms, "slow_ms": levels.slow_ms,
                           "parts": doc, "totals": {g: {"fast": f, "read": n} for g, (f, n) in by.items()}}
    (bf, bn), (qf, qn) = by["burn"], by["quiet"]
    if bn and qn:
        up, down = fisher_greater(bf, bn - bf, qf, qn - qf), fisher_greater(qf, qn - qf, bf, bn - bf)
        lines.append(f"Fisher's exact test, one-sided: the burner blocks faster p = {up:.3g}; the quiet blocks "
                     f"faster p = {down:.3g}.")
        out["fisher_burn_faster_p"], out["fisher_quiet_faster_p"] = up, down
    return lines, out


def _utc(t: float) -> str:
    return dt.datetime.fromtimestamp(t, dt.UTC).strftime("%H:%M:%S")


def summarise(work: Path, segments: int | None = None) -> tuple[str, dict[str, Any], list[str]]:
    """The markdown, the JSON document and the failed checks (empty: all passed, or none asked)."""
    tsv = work / "spread.tsv"
    text = tsv.read_text(encoding="utf-8").splitlines() if tsv.exists() else []
    parts = read_timeline_lines(text, str(tsv))
    passive, injected = records_in(work / "passive"), records_in(work / "injected")
    events = passive_starts(passive)
    cells = injected_reps(injected)
    t0 = min([p.start for p in parts] + events[:1]) if parts or events else 0.0
    burn = burners(text)
    rows, doc_parts = [], []
    for p in parts:
        if p.kind == "segment":
            n = sum(p.start <= t <= p.end for t in events)
            what = f"{n} passive events"
        else:
            n = sum(b == p.k - 1 for reps in cells.values() for b, _ in reps)
            what = f"{n} injected repetitions (block {p.k - 1})" + (
                f", beside {burn[p.k]} busy loops" if p.k in burn else "") + (
                f", {len(p.invocations)} invocations (rc {' '.join(map(str, p.invocations))})"
                if len(p.invocations) > 1 else "")
        rows.append(f"| {p.kind} {p.k} | {_utc(p.start)} | {_utc(p.end)} | {(p.start - t0) / 60:.2f} – "
                    f"{(p.end - t0) / 60:.2f} | {p.wall_s:.0f} | {what} |")
        doc_parts.append({"kind": p.kind, "k": p.k, "start": p.start, "end": p.end, "wall_s": round(p.wall_s, 1),
                          "count": n, "invocations": p.invocations, "burners": burn.get(p.k, 0) if p.kind == "block"
                          else 0})
    per_cell = Counter(len(reps) for reps in cells.values())
    outside = sum(not any(p.start <= t <= p.end for p in parts) for t in events)
    failed: list[str] = []
    if segments is not None:
        seg = {p.k: p for p in parts if p.kind == "segment"}
        for k in range(1, segments + 1):
            if k not in seg:
                failed.append(f"segment {k}: not in spread.tsv")
            elif not any(seg[k].start <= t <= seg[k].end for t in events):
                failed.append(f"segment {k}: no passive events")
        want = set(range(segments))
        short = [key for key, reps in cells.items() if sorted(b for b, _ in reps if b is not None) != sorted(want)
                 or len(reps) != segments]
        if not cells:
            failed.append("no injected records")
        elif short:
            failed.append(f"{len(short)} of {len(cells)} injected cells without exactly one repetition per block "
                          f"0..{segments - 1} (e.g. B={short[0][0]} D={short[0][1]} P={short[0][2]})")
    lines = [
        "| part | start (UTC) | end | minutes from the start | wall s | recorded in it |",
        "|---|---|---|---|---|---|",
        *rows,
        "",
        f"Injected cells: {len(cells)}; repetitions per cell: "
        + (", ".join(f"{n} reps × {c} cells" for n, c in sorted(per_cell.items())) or "none")
        + f". Passive events (published, in passive/B; joint and merged ones not counted): {len(events)}"
        + (f" ({outside} outside every segment's span: attributed after it ended)" if outside else "") + ".",
    ]
    if segments is not None:
        lines.append(f"Check ({segments} segments): " + ("passed" if not failed else "; ".join(failed)) + ".")
    level_text, level_doc = level_lines(passive, injected, parts, burn)
    if level_text:
        lines += ["", *level_text]
    doc = {"parts": doc_parts, "events": len(events), "events_outside": outside, "cells": len(cells),
           "reps_per_cell": {str(n): c for n, c in sorted(per_cell.items())}, "failed": failed,
           "launch_levels": level_doc}
    return "\n".join(lines), doc, failed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("work", type=Path)
    parser.add_argument("--segments", type=int, default=None, help="K: check K segments with events and K "
                        "repetitions per injected cell, one per block")
    args = parser.parse_args()
    try:
        text, doc, failed = summarise(args.work, args.segments)
    except PdexporterError as exc:  # one line, the last of spread.md (passive-h200.sh logs it)
        print(f"passive_spread: {exc}")
        return 2
    (args.work / "spread.json").write_text(json.dumps(doc, indent=1), encoding="utf-8")
    print(text)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
