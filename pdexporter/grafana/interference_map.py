"""The interference map: the seed's heatmap of penalty over P x D, one chunk size at a time.

It reads the `pdexporter_window_*` gauges that `pdexporter sweep --listen` (and `pdexporter run`)
export per grid point. A gauge holds only the last window, and a sweep moves on, so every grid
query takes `last_over_time(...[$__range])`: each point keeps the last value seen within the
dashboard's time range even after the sweep has moved past it (or finished).
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

UID = "pdexporter-interference-map"
FILE_NAME = f"{UID}.json"
TAG = "pdexporter"

ROW, COLUMN = "decode_batch_size", "new_prefill_tokens"
CORNER = "D (decode streams) \\ P (prefill tokens)"
SEL = 'chunk_size="$chunk_size", instance=~"$instance"'


def grid(series: str) -> str:
    """One value per (D, P) at the selected chunk size: the last seen in the time range."""
    return f"max by ({ROW}, {COLUMN}) (last_over_time({series}{{{SEL}}}[$__range]))"


def build() -> Json:
    d = Dashboard(
        uid=UID,
        title="pdexporter: interference map (P x D)",
        description=(
            "TPOT penalty over new_prefill_tokens (P, columns) x decode_batch_size (D, rows) at one chunk size "
            "(max_num_batched_tokens), from the window gauges a sweep exports. Each cell is the last window "
            "seen in the time range."
        ),
        tags=[TAG, "vllm", "sweep"],
        variables=[
            datasource_variable(),
            query_variable(
                "chunk_size", "Chunk size (B)", f"label_values({m.WINDOW_RATIO}, chunk_size)", numeric_sort=True
            ),
            query_variable(
                "instance",
                "Exporter",
                f'label_values({m.WINDOW_RATIO}{{chunk_size="$chunk_size"}}, instance)',
                multi=True,
                include_all=True,
            ),
        ],
        time_from="now-24h",
        refresh="1m",
        links=[dashboard_link("pdexporter dashboards", TAG)],
    )

    d.row("Penalty over P x D at B = $chunk_size")
    d.add(
        label_matrix(
            "Penalty ratio (TPOT penalty / baseline)",
            "The seed's heatmap: colour = tpot_penalty_ratio. Rows are D, columns are P. The seed expects it "
            "to grow with D and with the number of chunks, and counts the study a success if the ratio exceeds "
            "1.1 for D >= 4 and P >= 4096. Empty cells: no window at that point in the time range.",
            grid(m.WINDOW_RATIO),
            row_label=ROW,
            column_label=COLUMN,
            corner=CORNER,
            minimum=0,
        ),
        w=24,
        h=10,
    )
    d.add(
        label_matrix(
            "TPOT penalty p50",
            "TPOT during the prefill minus the baseline (p50s), per grid point.",
            grid(m.WINDOW_PENALTY),
            row_label=ROW,
            column_label=COLUMN,
            corner=CORNER,
            unit="s",
            decimals=1,
            minimum=0,
        ),
        w=12,
        h=10,
    )
    d.add(
        label_matrix(
            "Total interference per decode stream",
            "Extra time one decode stream lost to the prefill; times D it is the cost the offload rule "
            "compares with a KV transfer time.",
            grid(m.WINDOW_TOTAL),
            row_label=ROW,
            column_label=COLUMN,
            corner=CORNER,
            unit="s",
            decimals=1,
            minimum=0,
        ),
        w=12,
        h=10,
    )

    d.row("Chunking and timing at B = $chunk_size")
    d.add(
        label_matrix(
            "Slow steps minus expected chunks",
            "Decode steps the prefill slowed minus ceil(P / (B - D)). 0 means one slow step per predicted "
            "chunk; on vLLM 0.22 long prompts show +1 or +2 (the engine loop stalls admitting and retiring "
            "them); negative means chunks the cadence cannot see (a tiny last chunk).",
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
            "Prefill windows recorded at this chunk size within the time range (all grid points).",
            targets(
                (f'sum(increase({m.WINDOWS}{{{SEL}}}[$__range]))', "windows"),
            ),
            decimals=0,
            steps=thresholds((None, "blue")),
            graph=False,
        ),
        w=8,
        h=10,
    )
    return d.build()
