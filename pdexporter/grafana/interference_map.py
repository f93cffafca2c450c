"""The interference map: the seed's heatmap of penalty over P x D, one chunk size at a time,
injected (active) and from production prefills (passive) side by side, and the engines side by
side (every window series carries its `engine`: vLLM's map beside SGLang's, in each mode).

It reads the `pdexporter_window_*` gauges that `pdexporter sweep --listen` and `pdexporter run`
export per grid point, with `mode="active"` (an injected prefill) or `mode="passive"` (a
production prefill, `run --passive`, whose D and P labels are bins). A gauge holds only the last
window, and a sweep moves on, so every active grid query takes `last_over_time(...[$__range])`:
each point keeps the last value seen within the dashboard's time range even after the sweep has
moved past it. A passive cell sees a stream of production prefills, so its query takes the median
of the values scraped in the range (`quantile_over_time(0.5, ...)`), and a matrix beside it counts
the events each cell holds (the increase of `pdexporter_windows_total`): few events, little trust.
"""

from __future__ import annotations

from pdexporter.exporter import metrics as m
from pdexporter.grafana.panels import (
    Dashboard,
    Json,
    dashboard_link,
    datasource_variable,
    label_matrix,
    query_variable,
    stat,
    targets,
    thresholds,
)

__all__ = [
    "CORNER", "FILE_NAME", "MODE_TITLE", "SEL", "TAG", "UID", "build", "grid",
]

UID = "pdexporter-interference-map"
FILE_NAME = f"{UID}.json"
TAG = "pdexporter"

ROW, COLUMN = "decode_batch_size", "new_prefill_tokens"
CORNER = "D (decode streams) \\ P (prefill tokens)"
SEL = 'chunk_size="$chunk_size", engine=~"$engine", instance=~"$instance"'
MODE_TITLE = {"active": "injected", "passive": "production (passive)"}


def grid(series: str, mode: str = "active") -> str:
    """One value per (D, P) at the selected chunk size and engines: the last seen in the time range
    (active), the median of those scraped in it (passive: a stream of production prefills). A
    panel repeated per engine gets one engine as `$engine`."""
    selector = f'{series}{{{SEL}, mode="{mode}"}}'
    if mode == "passive":
        return f"max by ({ROW}, {COLUMN}) (quantile_over_time(0.5, {selector}[$__range]))"
    return f"max by ({ROW}, {COLUMN}) (last_over_time({selector}[$__range]))"


def _side_by_side(d: Dashboard, title: str, description: str, series: str, **style: object) -> None:
    """The same matrix for injected and for production prefills, next to each other."""
    for mode in ("active", "passive"):
        d.add(
            label_matrix(f"{title}: {MODE_TITLE[mode]}", description, grid(series, mode), row_label=ROW,
                         column_label=COLUMN, corner=CORNER, **style),  # type: ignore[arg-type]
            w=12,
            h=10,
        )


def _dashboard() -> Dashboard:
    """The map's frame: title, tags, the chunk size, engine and exporter variables, no panels yet."""
    return Dashboard(
        uid=UID,
        title="pdexporter: interference map (P x D)",
        description=(
            "TPOT penalty over new_prefill_tokens (P, columns) x decode_batch_size (D, rows) at one chunk size "
            "(max_num_batched_tokens), from the window gauges a sweep or the exporter exports: injected prefills "
            "(last window in range) beside production prefills seen in passive mode (median in range)."
        ),
        tags=[TAG, "vllm", "sglang", "sweep"],
        variables=[
            datasource_variable(),
            query_variable(
                "chunk_size", "Chunk size (B)", f"label_values({m.WINDOW_RATIO}, chunk_size)", numeric_sort=True
            ),
            query_variable(
                "engine",
                "Engine",
                f'label_values({m.WINDOW_RATIO}{{chunk_size="$chunk_size"}}, engine)',
                multi=True,
                include_all=True,
            ),
            query_variable(
                "instance",
                "Exporter",
                f'label_values({m.WINDOW_RATIO}{{chunk_size="$chunk_size", engine=~"$engine"}}, instance)',
                multi=True,
                include_all=True,
            ),
        ],
        time_from="now-24h",
        refresh="1m",
        links=[dashboard_link("pdexporter dashboards", TAG)],
    )


def _penalty_row(d: Dashboard) -> None:
    """The seed's maps, injected beside production: penalty ratio, penalty, total interference."""
    d.row("Penalty over P x D at B = $chunk_size: injected | production (passive)")
    _side_by_side(
        d, "Penalty ratio (TPOT penalty / baseline)",
        "The seed's heatmap: colour = tpot_penalty_ratio. Rows are D, columns are P. The seed expects it "
        "to grow with D and with the number of chunks, and counts the study a success if the ratio exceeds "
        "1.1 for D >= 4 and P >= 4096. Left: injected prefills (last window in range); right: production "
        "prefills seen in passive mode (median in range; D and P are bins). Empty cells: no window there.",
        m.WINDOW_RATIO, minimum=0,
    )
    _side_by_side(
        d, "TPOT penalty p50",
        "TPOT during the prefill minus the baseline (p50s), per grid point; left injected, right production "
        "prefills (passive mode).",
        m.WINDOW_PENALTY, unit="s", decimals=1, minimum=0,
    )
    _side_by_side(
        d, "Total interference per decode stream",
        "Extra time one decode stream lost to the prefill; times D it is the cost the offload rule "
        "compares with a KV transfer time. Left injected, right production prefills (passive mode).",
        m.WINDOW_TOTAL, unit="s", decimals=1, minimum=0,
    )


def _passive_cells(d: Dashboard) -> None:
    """How far to trust the passive maps: events per cell, passive minus injected, the event model."""
    d.add(
        label_matrix(
            "Production prefills per cell (passive)",
            "How many production prefills each passive cell holds: pdexporter_windows_total{mode=\"passive\"} "
            "at its highest in the time range, i.e. since each exporter started, summed over exporters. "
            "export-table --mode passive counts a time range exactly, marks cells with fewer than 5 events and "
            "gives bootstrap intervals.",
            f'sum by ({ROW}, {COLUMN}) (max_over_time({m.WINDOWS}{{{SEL}, mode="passive"}}[$__range]))',
            row_label=ROW, column_label=COLUMN, corner=CORNER, decimals=0, color_scheme="continuous-blues",
            minimum=0,
        ),
        w=12,
        h=10,
    )
    d.add(
        label_matrix(
            "Passive minus injected penalty",
            "Production (passive) penalty p50 minus the injected one, per cell both fill. Near 0: the passive "
            "map agrees with injection; a cell whose P bin straddles a step-time cliff (vLLM's CUDA-graph capture "
            "size, a second chunk) differs by construction (docs/exporter.md, 'Passive mode').",
            f"{grid(m.WINDOW_PENALTY, 'passive')} - {grid(m.WINDOW_PENALTY, 'active')}",
            row_label=ROW, column_label=COLUMN, corner=CORNER, unit="s", decimals=1,
            color_scheme="continuous-BlYlRd",
        ),
        w=12,
        h=10,
    )

    d.add(
        label_matrix(
            "Passive model: aggregate interference per cell",
            "Passive mode's answer for every cell: the cost model fitted on the production prefills event by "
            "event (exact D and P), refitted as they come; its estimate of D x total interference, the cost "
            "the offload rule compares with a KV transfer time. Its 95 % interval is the bound=\"low\" / "
            "\"high\" series; cells the traffic does not reach are extrapolations "
            "(pdexporter_passive_model_cell_reached = 0).",
            f'max by ({ROW}, {COLUMN}) ({m.PASSIVE_MODEL_PREDICTION}{{{SEL}, '
            'bound="estimate"})',
            row_label=ROW, column_label=COLUMN, corner=CORNER, unit="s", decimals=2, minimum=0,
        ),
        w=12,
        h=10,
    )
    d.add(
        label_matrix(
            "Passive model: 95 % interval half-width per cell",
            "How sure each cell's passive answer is: (high - low) / 2 over the estimate. Wide cells need more "
            "traffic; a cell the traffic does not reach stays wide or is an extrapolation.",
            f'max by ({ROW}, {COLUMN}) (({m.PASSIVE_MODEL_PREDICTION}{{{SEL}, '
            f'bound="high"}} - ignoring(bound) {m.PASSIVE_MODEL_PREDICTION}{{{SEL}, '
            f'bound="low"}}) / 2 / ignoring(bound) {m.PASSIVE_MODEL_PREDICTION}{{{SEL}, '
            'bound="estimate"})',
            row_label=ROW, column_label=COLUMN, corner=CORNER, unit="percentunit", decimals=0, minimum=0,
            color_scheme="continuous-GrYlRd",
        ),
        w=12,
        h=10,
    )


def _engines_row(d: Dashboard) -> None:
    """One map per engine selected (a panel repeated over $engine), side by side."""
    d.row("Engines side by side at B = $chunk_size (injected): one map per engine selected")
    for title, description, series, style in (
        ("Penalty ratio on $engine",
         "tpot_penalty_ratio per (D, P), one panel per engine selected (the Engine variable), side by side: e.g. "
         "vLLM beside SGLang, whose default mode pauses the decodes for a prefill's chunks (one long stall per "
         "prefill) where vLLM and SGLang's --enable-mixed-chunk run them beside each chunk (docs/engines.md).",
         m.WINDOW_RATIO, {"minimum": 0}),
        ("Total interference per decode stream on $engine",
         "Extra time one decode stream lost to the prefill, per (D, P), one panel per engine selected: the cost "
         "the engines compare on, however their steps interleave.",
         m.WINDOW_TOTAL, {"unit": "s", "decimals": 1, "minimum": 0}),
    ):
        panel = label_matrix(title, description, grid(series), row_label=ROW, column_label=COLUMN, corner=CORNER,
                             **style)
        panel.update(repeat="engine", repeatDirection="h", maxPerRow=3)
        d.add(panel, w=12, h=10)


def _chunking_row(d: Dashboard) -> None:
    """Chunking and timing per (D, P): slow steps against chunks, prefill duration, baseline."""
    d.row("Chunking and timing at B = $chunk_size (injected)")
    d.add(
        label_matrix(
            "Slow steps minus expected chunks",
            "Decode steps the prefill slowed minus the chunk steps the engine's rule predicts (vLLM: "
            "ceil(P / (B - D)); SGLang's default: one stall, its chunks run back to back). 0 means one slow step "
            "per predicted chunk step; on vLLM 0.22 long prompts show +1 or +2 (the engine loop stalls admitting "
            "and retiring them); negative means chunks the cadence cannot see (a tiny last chunk).",
            f"{grid(m.WINDOW_SLOW_STEPS)} - {grid(m.WINDOW_EXPECTED)}",
            row_label=ROW,
            column_label=COLUMN,
            corner=CORNER,
            decimals=0,
            color_scheme="continuous-BlYlRd",
        ),
        w=12,
        h=10,
    )
    d.add(
        label_matrix(
            "Prefill duration",
            "Prefill submission to first token, per grid point (queueing plus every chunk).",
            grid(m.WINDOW_PREFILL),
            row_label=ROW,
            column_label=COLUMN,
            corner=CORNER,
            unit="s",
            decimals=2,
            color_scheme="continuous-blues",
            minimum=0,
        ),
        w=12,
        h=10,
    )
    d.add(
        label_matrix(
            "Baseline TPOT p50",
            "Decode-only TPOT per grid point: the ratio's denominator. It depends on D only; a column-to-column "
            "spread shows baseline noise.",
            grid(m.WINDOW_BASELINE),
            row_label=ROW,
            column_label=COLUMN,
            corner=CORNER,
            unit="s",
            decimals=1,
            color_scheme="continuous-blues",
            minimum=0,
        ),
        w=16,
        h=10,
    )
    d.add(
        stat(
            "Windows analysed in range",
            "Prefill windows recorded at this chunk size within the time range (all grid points), injected "
            "(active) and production (passive).",
            targets(
                (f'sum by (mode) (increase({m.WINDOWS}{{{SEL}}}[$__range]))', "{{mode}}"),
            ),
            decimals=0,
            steps=thresholds((None, "blue")),
            graph=False,
        ),
        w=8,
        h=10,
    )


def build() -> Json:
    """The interference map, row by row."""
    d = _dashboard()
    _penalty_row(d)
    _passive_cells(d)
    _engines_row(d)
    _chunking_row(d)
    return d.build()
