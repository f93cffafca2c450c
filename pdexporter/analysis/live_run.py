"""The summary of a live-thresholds run (`scripts/gpu/live-thresholds-h200.sh`, issue 33): per load
phase, the live threshold of its last refresh at the D that phase ran, beside the batch ones (the
injected table of the same engine when swept, and the committed decision file), and whether the
batch threshold lies inside the live interval. Reads the run's folder; returns markdown."""

from __future__ import annotations

import csv
import json
import re
from pathlib import Path
from typing import Any

from pdexporter.analysis.thresholds import compute_thresholds
from pdexporter.engines import DEFAULT_CHUNK_SIZE

HEADER = ("| load (req/s) | D now | events | live threshold [90 %] | router's number | committed file "
          "| this engine's batch | inside? |")


def _last_sample(samples: list[Path], phase: str) -> str | None:
    texts = [p.read_text() for p in samples if f"load {phase} req/s" in p.read_text()]
    return texts[-1] if texts else None


def _number(pattern: str, text: str) -> int:
    found = re.search(pattern, text)
    if found is None:
        raise ValueError(f"/thresholds.yaml sample without {pattern!r}")
    return int(found.group(1))


def _row(phase: str, last: str, rows: list[dict[str, str]], committed: Any, batch: dict[str, Any] | None) -> str:
    b = DEFAULT_CHUNK_SIZE
    d = _number(r"the current load is D=(\d+)", last)
    events = _number(r"from (\d+) production prefills", last)
    value = _number(r"nonCachedTokens: (\d+)", last) + 1
    at = [r for r in rows if r["phase"] == phase and int(r["decode_batch_size"]) == d]
    t_last = max(r["unix_s"] for r in at)
    bounds = {r["bound"]: float(r["tokens"]) for r in at if r["unix_s"] == t_last}
    c = committed.at(b, d)
    mine = (batch or {}).get("chunk_sizes", {}).get(str(b), {}).get("by_decode_batch_size", {}).get(str(d))
    ref = mine["threshold"] if mine else (c.threshold if c else None)
    inside = ref is not None and bounds.get("low", 0) <= ref <= bounds.get("high", float("inf"))
    return (f"| {phase} | {d} | {events} | {bounds['central']:.0f} [{bounds['low']:.0f}..{bounds['high']:.0f}] "
            f"| {value} | {c.cell(committed.measured_p, short=True) if c else 'n/a'} "
            f"| {(str(mine['threshold']) + ' ' + str(mine['interval'])) if mine else 'not swept'} "
            f"| {'yes' if inside else 'NO'} |")


def live_run_summary(work: str | Path, batch_path: str, decision: str | Path, engine: str = "") -> str:
    """SUMMARY.md of the run in `work` (thresholds.tsv, thresholds/N.yaml); `batch_path` the injected
    table's offload_thresholds.json ('' when not swept); `engine` 'sim' marks it MODELLED."""
    w = Path(work)
    with (w / "thresholds.tsv").open() as handle:
        rows = list(csv.DictReader(handle, delimiter="\t"))
    samples = sorted(w.glob("thresholds/*.yaml"), key=lambda p: int(p.stem) if p.stem.isdigit() else 0)
    committed = compute_thresholds(json.loads(Path(decision).read_text()), chunk_sizes=[DEFAULT_CHUNK_SIZE])
    batch = json.loads(Path(batch_path).read_text()) if batch_path and Path(batch_path).is_file() else None
    where = "the embedded engine (MODELLED)" if engine == "sim" else "one H200"
    lines = [f"# Live router thresholds on {where} ", "", HEADER, "|---|---|---|---|---|---|---|---|"]
    for phase in dict.fromkeys(r["phase"] for r in rows):
        last = _last_sample(samples, phase)
        if last is not None:
            lines.append(_row(phase, last, rows, committed, batch))
    return "\n".join(lines)


__all__ = ["live_run_summary"]
