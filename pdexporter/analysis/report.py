"""One self-contained HTML report: table, plots (PNG as data: URIs), fits, decision, criteria.

Nothing in the page refers outside itself (no scripts, fonts or stylesheets from anywhere: its one
script, which sorts the interference table when a header is clicked, is inline), so it can be
mailed, attached to a ticket or opened offline. Modelled data gets a banner at the top and
MODELLED in every plot title.
"""

from __future__ import annotations

import base64
import datetime as dt
import html
import math
from importlib import resources
from pathlib import Path
from string import Template
from typing import Any

from pdexporter import __version__
from pdexporter._internal.atomic import atomic_write_text
from pdexporter.analysis.job import Analysis
from pdexporter.analysis.plots import Plot, all_plots
from pdexporter.analysis.thresholds import ThresholdSet

__all__ = [
    "MISSING", "REPORT_HTML", "render_report", "write_report",
]

REPORT_HTML = "report.html"


def _template() -> Template:
    text = resources.files("pdexporter.analysis").joinpath("templates/report.html").read_text(encoding="utf-8")
    return Template(text)


def _e(value: Any) -> str:
    return html.escape(str(value), quote=True)


MISSING = "n/a"  # the one mark of a value that is not there, whatever kind of empty it was


def _num(value: Any, digits: int = 4) -> str:
    if _isna(value) or (isinstance(value, float) and not math.isfinite(value)):
        return MISSING  # None, NaN and pandas' NA alike (integer columns held <NA>, shown as such)
    if isinstance(value, float):
        if value == 0 or 1e-3 <= abs(value) < 1e3:
            return f"{value:.{digits}g}"
        return f"{value:.1f}" if abs(value) >= 1e3 else f"{value:.{max(digits - 1, 1)}e}"
    return _e(value)


def _header(name: str) -> str:
    """A column name that may break after its underscores (long snake_case names stay narrow)."""
    return "_<wbr>".join(_e(part) for part in name.split("_"))


def _table(headers: list[str], rows: list[list[str]], text_cols: frozenset[int] = frozenset(), *,
           table_id: str | None = None, sortable: bool = False) -> str:
    head = "".join(f'<th class="{"text" if i in text_cols else ""}">{_header(h)}</th>' for i, h in enumerate(headers))
    body = "".join(
        "<tr>" + "".join(f'<td class="{"text" if i in text_cols else ""}">{cell}</td>' for i, cell in enumerate(r))
        + "</tr>" for r in rows
    )
    attrs = (f' id="{_e(table_id)}"' if table_id else "") + (' class="sortable"' if sortable else "")
    return f"<table{attrs}><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _banner(analysis: Analysis) -> str:
    if not analysis.modelled:
        return ""
    modelled = sum(1 for s in analysis.samples if s.modelled)
    engines = sorted({s.engine for s in analysis.samples if s.modelled})
    notes = "".join(f"<li>{_e(n)}</li>" for n in analysis.modelled_notes)
    return (f'<div class="banner" id="modelled-banner">MODELLED DATA: {modelled} of {len(analysis.samples)} grid '
            f"points come from a model ({_e(', '.join(engines))}), not from measurements on a GPU."
            f"{'<ul>' + notes + '</ul>' if notes else ''}</div>")


def _criteria(analysis: Analysis) -> str:
    rows = []
    for c in analysis.criteria:
        css = c.verdict.split()[0]
        rows.append([str(c.number), _e(c.name), _e(c.statement), f'<span class="{css}">{_e(c.verdict)}</span>',
                     _e(c.figure)])
    return _table(["#", "criterion", "statement", "verdict", "figure"], rows, frozenset({1, 2, 3, 4}))


def _fits(analysis: Analysis) -> str:
    report = analysis.fits
    if report is None:
        return "<p class=\"warn\">No cost model was fitted: " + _e("; ".join(analysis.notes)) + "</p>"
    parts = [f"<p>Target: {_e(report.target)}, over {report.n_points} grid points with D &ge; 1. "
             f"Chosen: <b>{_e(report.chosen)}</b> &mdash; {_e(report.reason)}.</p>"]
    score_rows = []
    for name, fit in report.fits.items():
        row = [_e(name), _e(fit.model.formula), _num(fit.in_sample_r2)]
        for scheme in sorted(fit.held_out):
            h = fit.held_out[scheme]
            row += [_num(h.r2), _num(h.rmse_ms, 3), _num(h.mape, 3)]
        score_rows.append(row)
    schemes = sorted(next(iter(report.fits.values())).held_out)
    headers = ["model", "formula", "in-sample R²"]
    for scheme in schemes:
        headers += [f"held-out R² ({scheme})", "RMSE ms", "MAPE"]
    parts.append(_table(headers, score_rows, frozenset({0, 1})))
    best = report.best.model
    coef_rows = [[_e(c.name), _num(c.value, 5), _num(c.stderr, 2), _e(c.unit),
                  _e(c.meaning) + (f'<br><span class="note">{_e(c.note)}</span>' if c.note else "")]
                 for c in best.coefficients()]
    parts.append(f"<h3>Coefficients of {_e(best.name)}</h3>")
    parts.append(_table(["coefficient", "value", "std. error", "unit", "meaning"], coef_rows, frozenset({0, 3, 4}),
                        table_id="coefficients", sortable=len(coef_rows) > 8))
    return "\n".join(parts)


def _decision(analysis: Analysis) -> str:
    doc = analysis.decision
    if doc is None:
        return "<p>No decision function (no fitted model).</p>"
    from pdexporter.analysis.decision_eval import held_out_text

    parts = [f"<p><b>{_e(held_out_text(doc))}</b> (<code>pdexporter validate</code>: every error measured on GPU "
             "campaigns the models were not fitted on).</p>"]
    parts += [f"<p>Rule: <code>{_e(doc['rule'])}</code>; cost = {_e(doc['cost'])}; the seed's transfer budget "
             f"{doc['transfer_ms_default']:g} ms. The router-loadable form is <code>decision.json</code> "
             f"(schema <code>{_e(doc['schema'])}</code>).</p>"]
    if doc.get("two_arm"):
        parts.append("<p>The thresholds a router takes are the two-arm verdict's: "
                     "<a href='#break-even'>Both arms, break-even</a>.</p>")
        return "\n".join(parts)
    from pdexporter.analysis.thresholds import compute_thresholds

    result = compute_thresholds(doc)
    parts.append("<p id='thresholds'>Smallest prefill (tokens) from which offloading wins (the seed's rule), per "
                 "chunk size and decode batch size D, with its 90 % interval over the bootstrap resamples: what "
                 "<code>pdexporter thresholds --model decision.json</code> prints.</p>")
    parts.append(_thresholds_table(result))
    return "\n".join(parts)


def _thresholds_table(result: ThresholdSet) -> str:
    """The one computation's thresholds (`analysis.thresholds`) as a table: the budget it charged,
    every cell's interval, and marks where a threshold lies outside the measured prompt lengths."""
    decodes = sorted({t.decode_batch_size for t in result.records})
    rows = []
    for b in result.chunk_sizes():
        entries = {t.decode_batch_size: t for t in result.by_chunk_size(b)}
        modelled = " (modelled)" if any(t.modelled_b for t in entries.values()) else ""
        rows.append([f"B={_e(b)}{modelled}"] + [_e(entries[d].cell(result.measured_p, short=True)) if d in entries
                                                 else MISSING for d in decodes])
    where = (f"; measured P {result.measured_p[0]}..{result.measured_p[1]} (a threshold outside it is the models' "
             "extrapolation and is marked)" if result.measured_p else "")
    head = f"<p class='budget'>{_e(result.mode)} verdict, {_e(result.budget.text())}{_e(where)}.</p>"
    return head + _table(["chunk size"] + [f"D={d}" for d in decodes], rows, frozenset({0}))


def _present(value: Any) -> bool:
    """A table value that is there: not None, NaN or pandas' NA (integer columns)."""
    import pandas as pd

    return value is not None and not pd.isna(value)


def _arms(analysis: Analysis) -> str:
    """Both arms (docs/disaggregation.md): the measured points side by side, the transfer model,
    the break-even (smallest prefill offloading wins at) and the figure."""
    arms = analysis.arms
    if arms is None:
        return ("<p>Only the colocated arm is here. <code>pdexporter report RESULTS --offloaded DIR</code> adds the "
                "offloaded arm (DecodeBenchConnector or a measured P/D pair) and the two-arm verdict.</p>")
    from pdexporter.analysis.plots import arms_plot

    table = analysis.table
    rows_ = table[table["offloaded_aggregate_interference_ms"].notna()]
    doc = analysis.decision or {}
    parts = [f"<p>Offloaded arm: {len(arms.samples)} grid points from <code>{_e(arms.source)}</code> "
             f"({_e(', '.join(sorted({s.engine for s in arms.samples})))}); "
             f"{_e((doc.get('two_arm') or {}).get('offloaded_setup', ''))}. Saved = colocated minus offloaded "
             "aggregate interference (the decode time the running decodes get back); TTFT cost = offloaded minus "
             "colocated TTFT (what the request pays).</p>"]
    t = arms.transfer
    if t is not None:
        parts.append(f"<p id='transfer-model'>KV transfer model ({_e(t.describe())}): latency + the prompt's KV "
                     "bytes at the bandwidth, fitted on the windows of its nominal regime.</p>")
    else:
        parts.append("<p class='warn' id='transfer-model'>No transfer was measured: the verdict uses the seed's "
                     f"constant {analysis.transfer_ms:g} ms in the offloaded TTFT.</p>")
    headers = ["B", "D", "P", "colocated aggregate ms", "offloaded aggregate ms", "saved ms", "colocated TTFT ms",
               "offloaded TTFT ms", "TTFT cost ms", "KV transfer ms", "KV MB", "verdict (two-arm, no SLO)"]
    body = []
    r: Any  # pandas-stubs types a row's fields as the union of every scalar; these columns are numbers
    for r in rows_.itertuples():
        saved = r.aggregate_interference_ms - r.offloaded_aggregate_interference_ms
        cost = (r.offloaded_ttft_ms - r.colocated_ttft_ms) if _present(r.offloaded_ttft_ms) else None
        verdict = ""
        if doc.get("two_arm") and r.decode_batch_size < r.chunk_size:
            verdict = _row_verdict(doc, r)
        body.append([_num(int(r.chunk_size)), _num(int(r.decode_batch_size)), _num(int(r.new_prefill_tokens)),
                     _num(r.aggregate_interference_ms), _num(r.offloaded_aggregate_interference_ms), _num(saved),
                     _num(r.colocated_ttft_ms), _num(r.offloaded_ttft_ms if cost is not None else None), _num(cost),
                     _num(r.kv_transfer_ms if _present(r.kv_transfer_ms) else None),
                     _num(r.kv_bytes / 2**20 if _present(r.kv_bytes) else None),
                     _e(verdict)])
    parts.append('<div class="scroll" id="arms-table">' + _table(headers, body, frozenset({11})) + "</div>")
    if arms.thresholds is not None:
        parts.append(
            "<p id='break-even'>Break-even: the smallest prefill (tokens) from which the two-arm verdict "
            "offloads, per chunk size and D, with its 90 % interval over the bootstrap resamples (no SLO; what "
            "<code>pdexporter thresholds --model decision.json</code> prints; <code>--tpot-slo-ms .. "
            "--ttft-slo-ms ..</code> for yours, and the llm-d snippet):</p>"
        )
        parts.append(_thresholds_table(arms.thresholds))
    plot = arms_plot(table, doc if doc.get("two_arm") else None)
    if plot is not None:
        parts.append(_plots([plot]))
        plot.figure.clear()
    return "\n".join(parts)


def _transfer_regime(doc: dict[str, Any], p: int, measured_ms: Any) -> str:
    """The transfer regime a measured point ran in: "degraded" where its transfer took more than
    DEGRADED_FACTOR x the nominal model (as `arms.fit_transfer` sets such windows apart), else "nominal"."""
    from pdexporter.analysis.arms import DEGRADED_FACTOR
    from pdexporter.analysis.decision_eval import transfer_time

    transfer = ((doc.get("two_arm") or {}).get("terms") or {}).get("transfer") or {}
    if not transfer.get("degraded") or transfer.get("source") != "measured" or not _present(measured_ms):
        return "nominal"
    return "degraded" if float(measured_ms) > DEGRADED_FACTOR * transfer_time(transfer, p) else "nominal"


def _row_verdict(doc: dict[str, Any], r: Any) -> str:
    """The two-arm verdict at a measured point, in the transfer regime the point was measured in:
    a point whose transfers ran degraded is set beside the degraded regime's verdict (its measured
    saving includes the stall), never beside the nominal one's."""
    from pdexporter.analysis.decision_eval import evaluate_decision

    regime = _transfer_regime(doc, int(r.new_prefill_tokens), r.kv_transfer_ms)
    verdict = evaluate_decision(doc, int(r.decode_batch_size), int(r.new_prefill_tokens), int(r.chunk_size),
                                mode="two-arm", regime=regime)["verdict"]
    return verdict if regime == "nominal" else f"{verdict} [the degraded transfer regime, as this point ran]"


def _plots(plots: list[Plot]) -> str:
    parts = []
    for plot in plots:
        data = base64.b64encode(plot.render("png")).decode("ascii")
        parts.append(f'<figure id="figure-{_e(plot.name)}"><img id="plot-{_e(plot.name)}" alt="{_e(plot.title)}" '
                     f'src="data:image/png;base64,{data}"><figcaption>{_e(plot.title)}</figcaption></figure>')
    return "\n".join(parts)


def _data_table(analysis: Analysis) -> str:
    frame = analysis.table
    headers = list(frame.columns)
    text_cols = frozenset(i for i, c in enumerate(headers) if c in ("engine", "gpu", "model", "modelled"))
    rows = [[_num(None if _isna(v) else (v.item() if hasattr(v, "item") else v)) for v in record]
            for record in frame.itertuples(index=False)]
    return _table(headers, rows, text_cols, table_id="interference-table", sortable=True)


def _isna(value: Any) -> bool:
    """None, NaN, pandas' NA or NaT (a scalar; anything else is there)."""
    import pandas as pd

    try:
        return value is None or bool(pd.isna(value))
    except (TypeError, ValueError):  # an array-like: not one missing value
        return False


def render_report(analysis: Analysis, plots: list[Plot] | None = None, now: dt.datetime | None = None) -> str:
    if plots is None:
        plots = all_plots(analysis.table, analysis.fits.best.model if analysis.fits else None, analysis.transfer_ms)
    when = (now or dt.datetime.now(dt.UTC)).isoformat(timespec="seconds")
    engines = sorted({s.engine for s in analysis.samples})
    reps = sum(len(s.reps) for s in analysis.samples)
    subtitle = (f"{len(analysis.samples)} grid points, {reps} repetitions, engine(s) {', '.join(engines)}; "
                f"source {analysis.source or 'n/a'}; generated {when} by pdexporter {__version__}")
    mismatches = ""
    if analysis.mismatches:
        mismatches = (f'<span class="warn">{len(analysis.mismatches)} values in record top levels differ from '
                      f"the medians of their repetitions (the table uses the medians): "
                      f"{_e('; '.join(analysis.mismatches[:5]))}</span>")
    title = "pdexporter: prefill/decode interference report" + (" (MODELLED)" if analysis.modelled else "")
    return _template().substitute(
        generator=_e(f"pdexporter {__version__}"),
        title=_e(title),
        subtitle=_e(subtitle),
        banner=_banner(analysis),
        criteria=_criteria(analysis),
        fits=_fits(analysis),
        decision=_decision(analysis),
        arms=_arms(analysis),
        plots=_plots(plots),
        mismatches=mismatches,
        table=_data_table(analysis),
    )


def write_report(analysis: Analysis, path: str | Path, plots: list[Plot] | None = None) -> Path:
    return atomic_write_text(path, render_report(analysis, plots))
