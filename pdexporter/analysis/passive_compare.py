"""A passive run against injection on the same engine, and trace-based against cadence-based
attribution (issue 23): `scripts/gpu/passive_compare.py` (run by scripts/gpu/passive-h200.sh and
scripts/results.sh) is a thin shell over `compare_passive`; works on any passive records.

1. The passive records (`run --passive --out`): every published event with its exact D and P, and
   the P the probes' cadence alone gave for the same run (`passive.cadence_prompt_tokens`).
2. The injected table: the injected directory (measured on this engine, this run), completed by
   `reference` (an earlier injected run of the same engine) only for grid cells it lacks: a
   complete injected sweep needs no reference, and a reference that is not there is one line on
   stderr, not a failure; the summary says which cells came from where. With neither, the model
   and the attribution are still compared, without an error column.
3. The event-fitted model (`analysis.passive_model`) on the first minutes of traffic against that
   table over the reached cells, with P from the engine's traces (the run's own attribution); and
   the same with P from the cadence alone, event for event: how far the two sources' P are apart,
   and what the cadence's P does to the model.

With `launch_level="matched"` the fits are the default (mixed) ones, and each model block adds a
**level-matched** scoring beside its headline figure, never instead of it
(`passive_model.level_matched`, module docs "Level-matched scoring"): each launch-bound injected
cell scored at the launch level its own repetitions' chunk steps show, classified by the modes the
events' launch-bound one-chunk steps were split into; per cell the level, the repetitions read,
and how many events of the cell's bins the estimate at that level rests on.

Writes OUT/comparison.md (RUN.md-ready), OUT/comparison.json and OUT/plots/passive_attribution.png
(and .svg: the two sources' P event for event, each model's error vs minutes).
"""

from __future__ import annotations

import collections
import dataclasses
import json
import statistics
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from pdexporter.analysis.job import injected_values, request_prompts
from pdexporter.analysis.passive_model import (
    CONVERGENCE_BOOTSTRAP,
    CONVERGENCE_MINUTES,
    LAUNCH_LEVELS,
    MATCHED,
    FitEvent,
    Grid,
    LevelMatched,
    PassiveAnswer,
    answer,
    events_from_records,
    injected_reps,
    level_matched,
)
from pdexporter.analysis.plots import Plot, write_plots
from pdexporter.errors import PdexporterError, RecordError
from pdexporter.measure.passive import JOINT_DIR, bin_int
from pdexporter.measure.records import RunRecord
from pdexporter.measure.store import ResultsStore, load_record_file

__all__ = [
    "SCORING_LEVELS", "SPREAD_KINDS", "attribution_plot", "compare_passive", "spread_segments", "spread_timeline",
]

Key = tuple[int, int, int]
SCORING_LEVELS = (*LAUNCH_LEVELS, MATCHED)  # --launch-level: a fit's level, or the mixed fit scored level-matched


def _records(root: Path) -> list[RunRecord]:
    """The published events' records and the joint ones' (`root/joint`)."""
    paths = [*ResultsStore(root).iter_record_paths(), *ResultsStore(root / JOINT_DIR).iter_record_paths()]
    return [load_record_file(p) for p in paths]


def _note(text: str) -> None:
    print(f"passive_compare: {text}", file=sys.stderr)


def _injected(root: Path | None, flag: str) -> dict[Key, float]:
    """An injected table's aggregate interference per cell; {} (and one line on stderr) where the
    directory is absent, holds no records or no injected ones: the comparison goes on without it."""
    if root is None:
        return {}
    if not root.is_dir():
        _note(f"{flag} {root}: no such directory (not copied to this machine?); compared without it")
        return {}
    if not any(ResultsStore(root).iter_record_paths()):
        _note(f"{flag} {root}: no records (expected {root}/<chunk_size>/D<d>_P<p>.json); compared without it")
        return {}
    try:
        return injected_values(root)
    except PdexporterError as exc:
        _note(f"{flag} {root}: {exc}; compared without it")
        return {}


def _reps(root: Path | None) -> dict[Key, list[FitEvent]]:
    """The injected records' repetitions per cell (`passive_model.injected_reps`), {} where none."""
    if root is None or not root.is_dir():
        return {}
    try:
        return injected_reps(load_record_file(p) for p in ResultsStore(root).iter_record_paths())
    except PdexporterError as exc:
        _note(f"{root}: {exc}; its repetitions' launch levels not read")
        return {}


def _fmt(x: float | None, pct: bool = True) -> str:
    if x is None:
        return "-"
    return f"{x * 100:.1f} %" if pct else f"{x:.1f}"


def attribution_plot(both: list[tuple[FitEvent, int]], fits: dict[str, PassiveAnswer]) -> Plot:
    """Left: P from the cadence against P from the traces, event for event (the diagonal and its
    ±25 % band); right: each source's model, its mean |error| against injection vs minutes."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(10, 4))
    left, right = fig.subplots(1, 2)
    if both:
        xs = [e.prompt for e, _ in both]
        ys = [max(p, 1) for _, p in both]
        left.scatter(xs, ys, s=12, alpha=0.7)
        lo, hi = min(xs + ys) / 1.5, max(xs + ys) * 1.5
        left.plot([lo, hi], [lo, hi], color="grey", lw=1, label="same P")
        left.fill_between(
            [lo, hi],
            [lo * 0.75, hi * 0.75],
            [lo * 1.25, hi * 1.25],
            color="grey",
            alpha=0.15,
            label="within 25 %",
        )
        left.set_xscale("log")
        left.set_yscale("log")
        left.legend(fontsize=8)
    left.set_xlabel("P from the engine's traces (tokens)")
    left.set_ylabel("P from the probes' cadence (tokens)")
    left.set_title(f"the same {len(both)} events, sized two ways", fontsize=9)
    for label, result in fits.items():
        points = [
            (c.minutes, c.errors.mape) for c in result.convergence if c.errors and c.errors.mape is not None
        ]
        if points:
            right.plot([m for m, _ in points], [e * 100 for _, e in points], "o-", label=label)
    right.axhline(15, color="grey", ls=":", label="goal 15 %")
    right.set_ylim(bottom=0)
    right.set_xlabel("minutes of traffic")
    right.set_ylabel("mean |error| vs injected, reached cells (%)")
    right.set_title("the event model on each source's P", fontsize=9)
    right.legend(fontsize=8)
    for ax in (left, right):
        ax.grid(True, alpha=0.3)
    title = "Passive mode: trace-based against cadence-based attribution"
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return Plot("passive_attribution", title, fig)


def _levels_line(result: PassiveAnswer) -> list[str]:
    """What the launch-level split did (none for the mixed fit)."""
    m = result.model
    if m.launch_level == "mixed" or m.levels is None:
        return []
    lv = m.levels
    if not lv.split:
        return [f"Launch level {m.launch_level}: {lv.events} launch-bound one-chunk events, no clear two levels "
                f"(Ashman's D {_fmt(lv.separation, pct=False)}): every event used.", ""]
    return [
        f"Launch level {m.launch_level}: {lv.events} launch-bound one-chunk events in two levels (step extra "
        f"over the baseline, median: fast {lv.fast_ms:.1f} ms, {lv.events - lv.slow_events} events; slow "
        f"{lv.slow_ms:.1f} ms, {lv.slow_events} events; Ashman's D {lv.separation:.1f}); the fit leaves out the "
        f"{'fast' if m.launch_level == 'slow' else 'slow'} ones.",
        "",
    ]


def _matched_lines(series: list[LevelMatched | None], result: PassiveAnswer, table: dict[Key, float],
                   origin: dict[Key, str]) -> list[str]:
    """The level-matched scoring (module docs) beside the headline: its error vs minutes, and per
    compared cell the level its repetitions read, the events the estimate rests on, both errors."""
    last = series[-1]
    lines = ["", "#### Level-matched scoring (not the headline figure)", ""]
    if last is None:
        return [*lines, "no model to score"]
    lv = last.levels
    split = (
        f"fast {lv.fast_ms:.1f} ms, {lv.events - lv.slow_events} events; slow {lv.slow_ms:.1f} ms, "
        f"{lv.slow_events} events; Ashman's D {lv.separation:.1f}"
        if lv.split and lv.fast_ms is not None and lv.slow_ms is not None and lv.separation is not None
        else f"no clear two levels (Ashman's D {_fmt(lv.separation, pct=False)}): every cell keeps the mixed estimate"
    )
    lines.extend([
        "Each launch-bound injected cell scored at the launch level its own repetitions' chunk steps show "
        "(classified by the two modes fitted to the events' launch-bound one-chunk chunk steps: "
        f"{lv.events} events, {split}), against the slow and the fast fits' estimates mixed in the "
        "repetitions' proportion; every other cell as above. The mixed figure above stays the answer: which "
        "level a reference reads is the host's state at that minute, which the events cannot know.",
        "",
        "| minutes | cells | level-matched MAPE vs injected | median | max | injected inside the 95 % interval "
        "| mixed MAPE (headline) | mixed inside |",
        "|---|---|---|---|---|---|---|---|",
    ])
    for conv, m in zip(result.convergence, series):
        e, h = (m.errors if m else None), conv.errors
        lines.append(
            f"| {conv.minutes:g} | {e.cells if e else '-'} | {_fmt(e.mape if e else None)} | "
            f"{_fmt(e.median if e else None)} | {_fmt(e.worst if e else None)} | {e.coverage if e else '-'} | "
            f"{_fmt(h.mape if h else None)} | {h.coverage if h else '-'} |"
        )
    mixed = result.errors.by_cell if result.errors is not None else {}
    lines.extend([
        "",
        "| D | P | level (reps slow/fast of read) | events it rests on (read at its level) "
        "| level-matched ms [95 % CI] | injected ms (from) | level-matched error | mixed error |",
        "|---|---|---|---|---|---|---|---|",
    ])
    for mc in last.cells:
        k = mc.cell.key
        if k not in last.errors.by_cell:
            continue
        ci = "" if mc.cell.low_ms is None else f" [{mc.cell.low_ms:.0f}-{mc.cell.high_ms:.0f}]"
        reps = f" ({mc.slow_reps}/{mc.fast_reps} of {mc.reps})" if mc.reps else ""
        rests = f"{mc.level_events} ({mc.read_events})" if mc.matched else f"{mc.level_events}"
        headline = f"{mixed[k] * 100:+.1f} %" if k in mixed else "-"
        lines.append(
            f"| {k[1]} | {k[2]} | {mc.level}{reps} | {rests} | {mc.cell.aggregate_ms:.0f}{ci} | "
            f"{table[k]:.0f} ({origin[k]}) | {last.errors.by_cell[k] * 100:+.1f} % | {headline} |"
        )
    return lines


def _model_lines(title: str, result: PassiveAnswer | None, table: Mapping[Key, float],
                 origin: Mapping[Key, str]) -> list[str]:
    """One event model's section: its convergence, the cells it did not reach, its error per cell."""
    if result is None:
        return ["", f"### {title}", "", "too few events inside the grid's prompt span for a model"]
    lines = ["", f"### {title}", "", *_levels_line(result),
             "| minutes | events used | cells reached | 95 % half-width | MAPE vs injected | median | max "
             "| injected inside the 95 % interval |",
             "|---|---|---|---|---|---|---|---|"]
    for c in result.convergence:
        e = c.errors
        lines.append(
            f"| {c.minutes:g} | {c.events} | {c.reached} | {_fmt(c.halfwidth)} | "
            f"{_fmt(e.mape if e else None)} | {_fmt(e.median if e else None)} | "
            f"{_fmt(e.worst if e else None)} | {e.coverage if e else '-'} |"
        )
    for why, keys in result.not_reached.items():
        lines.append(
            f"- not reached, {why}: {len(keys)} cells ({', '.join(keys[:8])}"
            f"{', ...' if len(keys) > 8 else ''})"
        )
    if result.errors is not None and result.errors.by_cell:
        lines.extend(["", "| D | P | events in bin | predicted ms [95 % CI] | injected ms (from) | error |",
                      "|---|---|---|---|---|---|"])
        for cell in result.cells:
            if cell.key in result.errors.by_cell:
                ci = "" if cell.low_ms is None else f" [{cell.low_ms:.0f}-{cell.high_ms:.0f}]"
                lines.append(
                    f"| {cell.key[1]} | {cell.key[2]} | {cell.events} | {cell.aggregate_ms:.0f}{ci} | "
                    f"{table[cell.key]:.0f} ({origin[cell.key]}) | "
                    f"{result.errors.by_cell[cell.key] * 100:+.1f} % |"
                )
    return lines


def _title(chunks: Sequence[int], launch_level: str, variation: bool) -> str:
    level = (
        "" if launch_level == "mixed"
        else ", level-matched scoring beside the mixed headline" if launch_level == MATCHED
        else f", launch level {launch_level}"
    )
    if variation:
        level += "; the full fits' intervals carry the campaign variation"
    return f"## Passive against injection on the same engine (B = {', '.join(map(str, chunks))}{level})"


SPREAD_KINDS = ("segment", "block")  # the lines of a spread run's spread.tsv (scripts/gpu/passive-h200.sh)


def spread_timeline(lines: Sequence[str], source: str = "spread.tsv") -> list[tuple[str, int, float, float, int]]:
    """A spread run's `spread.tsv` (`segment|block  k  start  end  rc` a line, epoch s; a block has one
    line per sweep invocation) as (kind, k, start, end, rc) rows; other lines are skipped, a segment or
    block line that does not read is one error naming `source` and the line."""
    rows = []
    for n, line in enumerate(lines, 1):
        cols = line.split()
        if not cols or cols[0] not in SPREAD_KINDS:
            continue
        try:
            k, start, end = int(cols[1]), float(cols[2]), float(cols[3])
            rc = int(cols[4]) if len(cols) > 4 else 0
        except (IndexError, ValueError):
            raise RecordError(f"{source}:{n}: a {cols[0]} line is `{cols[0]} k start end rc` (epoch s), "
                              f"got {line!r}") from None
        if not end >= start:
            raise RecordError(f"{source}:{n}: {cols[0]} ends ({end:g}) before it starts ({start:g})")
        rows.append((cols[0], k, start, end, rc))
    return rows


def spread_segments(path: Path) -> list[tuple[float, float]]:
    """The passive segments' wall spans (epoch s) of a spread run's `spread.tsv` (`spread_timeline`);
    one line naming the file (and line) where it cannot be read or holds no segment."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError as exc:
        raise RecordError(f"{path}: unreadable ({exc.strerror or exc})") from exc
    spans = [(start, end) for kind, _, start, end, _ in spread_timeline(lines, str(path)) if kind == "segment"]
    if not spans:
        raise RecordError(f"{path}: no segment lines (`segment k start end rc`)")
    return spans


def compare_passive(passive_dir: Path, injected: Path | None, *, reference: Path | None = None,
                    out: Path = Path("."), minutes: Sequence[float] = CONVERGENCE_MINUTES,
                    bootstrap: int = 200, launch_level: str = "mixed",
                    variation: Mapping[str, Any] | None = None,
                    traffic_spans: Sequence[tuple[float, float]] | None = None) -> str | None:
    """The comparison (module docs) written to `out`; its markdown, or None (and one line on
    stderr) where `passive_dir` holds no passive events. `launch_level`: the event model's
    launch-bound one-chunk events (`passive_model`, "Launch levels"); "mixed" uses them all;
    "matched": the mixed fits, each with the level-matched scoring beside it (module docs).
    `variation` (held_out.json's, `campaigns.load_variation`): the full fits' intervals carry the
    campaign variation, as `export-table --campaign-variation` makes them (the convergence rows keep
    the events' own). `traffic_spans` (epoch s): where the traffic ran (a spread run's passive
    segments, `spread_segments`): the minutes are the traffic's, the injected blocks between left out."""
    if launch_level not in SCORING_LEVELS:
        raise ValueError(f"launch level {launch_level!r}: one of {', '.join(SCORING_LEVELS)}")
    matched = launch_level == MATCHED
    fit_level = "mixed" if matched else launch_level

    records = (
        [r for r in _records(passive_dir) if r.config.mode == "passive"]
        if passive_dir.is_dir()
        else []
    )
    events = events_from_records(records, request_prompts([passive_dir]), traffic_spans)
    if not events:
        _note(f"{passive_dir}: no passive events (expected `run --passive --out` records there)")
        return None
    chunks = sorted({e.chunk_size for e in events})
    grid = Grid(tuple(chunks))
    fresh = _injected(injected, "--injected")
    missing = [k for k in grid.cells() if k not in fresh]
    ref_table = _injected(reference, "--reference") if reference is not None and missing else {}
    if reference is not None and not missing:
        _note(f"--reference {reference} not read: {injected} holds every cell of the grid")
    table = {**{k: v for k, v in ref_table.items() if k[0] in chunks}, **fresh}
    origin = {k: ("this run" if k in fresh else "reference") for k in table}
    reps: dict[Key, list[FitEvent]] = {}
    if matched:
        reps = {k: v for k, v in _reps(reference).items() if origin.get(k) == "reference"} if ref_table else {}
        reps.update({k: v for k, v in _reps(injected).items() if k in fresh})

    lines = [_title(chunks, launch_level, bool(variation)), ""]
    sources = collections.Counter(e.source for e in events)
    injected_line = (
        f"Injected cells: {sum(v == 'this run' for v in origin.values())} measured in this run, "
        f"{sum(v == 'reference' for v in origin.values())} from {reference if ref_table else 'no reference'}."
        if table
        else "No injected table (no injected records, no reference): the model's error is not computed."
    )
    joint = [e for e in events if e.prefills > 1]
    own = sum(e.own_prompts for e in joint)
    joint_line = (
        f" Joint events: {len(joint)}, {own} priced by their own prompts' attention pairs "
        f"(passive_model, \"Joint events\"), {len(joint) - own} as one prompt of the summed P (prompts unknown)."
        if joint else ""
    )
    lines.append(
        f"{len(events)} published events over {max((e.at_s for e in events), default=0) / 60:.1f} min of "
        f"traffic{' (its segments only, the injected blocks between them left out)' if traffic_spans else ''}, "
        f"P from: {dict(sources)}. {injected_line}{joint_line}"
    )
    doc: dict[str, Any] = {
        "launch_level": launch_level,
        "events": len(events),
        "sources": dict(sources),
        "joint_events": {"events": len(joint), "own_prompts": own},
        "injected_origin": {f"B={k[0]} D={k[1]} P={k[2]}": v for k, v in sorted(origin.items())},
    }

    fits: dict[str, PassiveAnswer] = {}

    def model_block(title: str, evs: list[FitEvent], label: str) -> dict[str, Any]:
        result = answer(evs, grid, injected=table or None, minutes=list(minutes), bootstrap=bootstrap,
                        launch_level=fit_level, variation=variation)
        if result is not None:
            fits[label] = result
        lines.extend(_model_lines(title, result, table, origin))
        if result is None:
            return {"model": None}
        block = result.to_dict()
        if matched and table:
            series = [
                level_matched([e for e in evs if e.at_s <= c.minutes * 60.0], grid, table, reps,
                              bootstrap=min(bootstrap, CONVERGENCE_BOOTSTRAP))
                for c in result.convergence[:-1]
            ]
            series.append(level_matched(evs, grid, table, reps, bootstrap=bootstrap, mixed=result.model,
                                        variation=variation))
            lines.extend(_matched_lines(series, result, table, origin))
            block["level_matched"] = [
                {"minutes": c.minutes, **(m.to_dict() if m else {})} for c, m in zip(result.convergence, series)
            ]
        return block

    doc["traces"] = model_block(
        "Event model, P from the engine's traces (the run's attribution)",
        events,
        "P from the run's attribution",
    )

    # trace-based against cadence-based attribution, event for event
    both = [(e, e.cadence_prompt) for e in events if e.source == "otlp" and e.cadence_prompt]
    lines.extend(["", "### Trace-based against cadence-based attribution (same events)", ""])
    if both:
        rel = [abs(p - e.prompt) / e.prompt for e, p in both]
        same_bin = sum(
            bin_int(p, (512, 1024, 2048, 4096, 8192, 16384, 32768))
            == bin_int(e.prompt, (512, 1024, 2048, 4096, 8192, 16384, 32768))
            for e, p in both
        )
        big = [r for (e, _), r in zip(both, rel) if e.prompt >= 1024]
        lines.append(
            f"{len(both)} events sized by traces and by the cadence: |P_cadence - P_traces| / P_traces "
            f"median {_fmt(statistics.median(rel))}, within 25 %: {sum(r <= 0.25 for r in rel)}/{len(rel)}; "
            f"same P bin of the seed's grid: {same_bin}/{len(both)}; prompts >= 1024 tokens: median "
            f"{_fmt(statistics.median(big) if big else None)}, within 25 %: "
            f"{sum(r <= 0.25 for r in big)}/{len(big)}."
        )
        doc["attribution"] = {
            "events": len(both),
            "median_rel_error": statistics.median(rel),
            "within_25pct": sum(r <= 0.25 for r in rel),
            "same_bin": same_bin,
            "median_rel_error_ge_1024": statistics.median(big) if big else None,
        }
        cadence_events = [dataclasses.replace(e, prompt=int(p), source="cadence") for e, p in both]
        doc["cadence"] = model_block(
            "Event model, P from the cadence alone (same events)", cadence_events, "P from the cadence alone"
        )
    else:
        lines.append(
            "no event carries both a trace-based and a cadence-based P (traces off, or no cadence model)"
        )
        doc["attribution"] = None
    write_plots([attribution_plot(both, fits)], out / "plots")
    lines.extend(
        [
            "",
            "`plots/passive_attribution.png`: the two sources' P event for event, each model's error vs minutes.",
        ]
    )
    text = "\n".join(lines) + "\n"
    out.mkdir(parents=True, exist_ok=True)
    (out / "comparison.md").write_text(text)
    (out / "comparison.json").write_text(json.dumps(doc, indent=1, default=str))
    return text
