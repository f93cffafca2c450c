"""The live-probe dashboard: what `pdexporter run` sees while it probes an engine."""

from __future__ import annotations

from pdexporter.exporter import metrics as m
from pdexporter.grafana.panels import (
    Dashboard,
    Json,
    dashboard_link,
    datasource_variable,
    info_table,
    query_variable,
    stat,
    target,
    targets,
    thresholds,
    timeseries,
    up_down_mappings,
    values_table,
)
from pdexporter.measure.quantities import gauged

__all__ = [
    "FILE_NAME", "GRID_LEGEND", "RATE", "SEL", "TAG", "UID", "build",
]

UID = "pdexporter-live"
FILE_NAME = f"{UID}.json"
TAG = "pdexporter"

SEL = 'instance=~"$instance"'
RATE = "$__rate_interval"
GRID_LEGEND = "{{mode}} B={{chunk_size}} D={{decode_batch_size}} P={{new_prefill_tokens}}"


def _quantile(q: float, histogram: str, by: str) -> str:
    return f"histogram_quantile({q}, sum by ({by}, le) (rate({histogram}_bucket{{{SEL}}}[{RATE}])))"


def _dashboard() -> Dashboard:
    """The live dashboard's frame: title, tags, variables and links, no panels yet."""
    return Dashboard(
        uid=UID,
        title="pdexporter: live interference probes",
        description=(
            "Probe streams decoding beside a periodic prefill on a vLLM (or the embedded engine, whose numbers "
            "are modelled): TPOT by window phase, the last window's penalty, prefill duration, chunking, engine "
            "load and the exporter's own health. Series are described in docs/metrics.md."
        ),
        tags=[TAG, "vllm", "live"],
        variables=[
            datasource_variable(),
            query_variable("instance", "Exporter", f"label_values({m.UP}, instance)", multi=True, include_all=True),
            query_variable("decodes", "Threshold D", f"label_values({m.OFFLOAD_THRESHOLD}, decode_batch_size)",
                           multi=True, include_all=True, numeric_sort=True),
        ],
        links=[dashboard_link("pdexporter dashboards", TAG)],
    )


def _probe_tpot_row(d: Dashboard) -> None:
    """The probe TPOT row: interval quantiles and means by window phase (the last window follows)."""
    d.row("Probe TPOT (inter-token intervals of the probe streams)")
    d.add(
        timeseries(
            "TPOT by phase: p50 / p90 / p99",
            "Quantiles of every probe inter-token interval, by the window phase the window maths put it in. "
            "The gap between baseline and prefill_window (every interval from the injection to the prefill's "
            "first token: chunk steps, engine stalls and decode-only steps) is the interference; "
            "after_prefill shows recovery.",
            [
                target(_quantile(q, m.PROBE_TPOT, "phase"), f"{{{{phase}}}} p{round(q * 100)}", ref_id=ref)
                for ref, q in (("A", 0.5), ("B", 0.9), ("C", 0.99))
            ],
            unit="s",
            minimum=0,
        ),
        w=12,
        h=9,
    )
    d.add(
        timeseries(
            "Mean TPOT by phase",
            "Mean probe interval by phase. In the prefill window the distribution has two humps (decode-only "
            "and mixed steps), so the mean moves where the p50 may not.",
            targets(
                (
                    f"sum by (phase) (rate({m.PROBE_TPOT}_sum{{{SEL}}}[{RATE}]))"
                    f" / sum by (phase) (rate({m.PROBE_TPOT}_count{{{SEL}}}[{RATE}]))",
                    "{{phase}} mean",
                ),
            ),
            unit="s",
            minimum=0,
        ),
        w=12,
        h=9,
    )


def _last_window_panels(d: Dashboard) -> None:
    """The probe TPOT row's second half: what the last analysed window of each grid point reports."""
    d.add(
        stat(
            "Last window: TPOT penalty p50",
            "TPOT during the prefill minus the baseline (p50s), for the last analysed window of each grid point.",
            targets((f"{m.WINDOW_PENALTY}{{{SEL}}}", GRID_LEGEND)),
            unit="s",
            decimals=1,
            steps=thresholds((None, "green"), (0.005, "yellow"), (0.02, "red")),
        ),
        w=6,
        h=6,
    )
    d.add(
        stat(
            "Last window: penalty ratio",
            "Penalty / baseline: the seed's tpot_penalty_ratio. Its success criterion is > 1.1 for D >= 4 and "
            "P >= 4096.",
            targets((f"{m.WINDOW_RATIO}{{{SEL}}}", GRID_LEGEND)),
            decimals=2,
            steps=thresholds((None, "green"), (0.5, "yellow"), (1.1, "red")),
        ),
        w=6,
        h=6,
    )
    d.add(
        timeseries(
            "Last window: TPOT baseline / during / after (p50)",
            "The three p50s each window reports. A new point appears each time a window is analysed.",
            targets(
                (f"{m.WINDOW_BASELINE}{{{SEL}}}", "baseline " + GRID_LEGEND),
                (f"{m.WINDOW_DURING}{{{SEL}}}", "during " + GRID_LEGEND),
                (f"{m.WINDOW_AFTER}{{{SEL}}}", "after " + GRID_LEGEND),
            ),
            unit="s",
            minimum=0,
        ),
        w=12,
        h=6,
    )

    d.add(
        values_table(
            "Last window: every quantity",
            "Every window quantity pdexporter declares (pdexporter/measure/quantities.py; docs/metrics.md), "
            "for the last window of each grid point.",
            [(f"{q.gauge_name}{{{SEL}}}", q.field, "s" if q.unit == "ms" else "none") for q in gauged()],
            ["mode", "chunk_size", "decode_batch_size", "new_prefill_tokens", "instance"],
        ),
        w=24,
        h=8,
    )


def _prefill_row(d: Dashboard) -> None:
    """Prefill durations, slow steps against chunks, total interference, injections and windows."""
    d.row("Prefill")
    d.add(
        timeseries(
            "Prefill duration (submission to first token)",
            "Quantiles over every prefill, injected (active) or production (passive: the slow run's length), by "
            "prefill size, and the last window's duration.",
            targets(
                (
                    _quantile(0.5, m.PREFILL_DURATION, "mode, new_prefill_tokens"),
                    "p50 {{mode}} P={{new_prefill_tokens}}",
                ),
                (
                    _quantile(0.9, m.PREFILL_DURATION, "mode, new_prefill_tokens"),
                    "p90 {{mode}} P={{new_prefill_tokens}}",
                ),
                (f"{m.WINDOW_PREFILL}{{{SEL}}}", "last " + GRID_LEGEND),
            ),
            unit="s",
            minimum=0,
        ),
        w=8,
    )
    d.add(
        timeseries(
            "Slow steps vs expected chunks",
            "Decode steps the last prefill slowed (cadence), its chunks (the engine's iteration log when "
            "pdexporter can read it, else the slow steps) and ceil(P / (B - D)): each chunk is B - D tokens "
            "because running decodes take their token first. On vLLM 0.22 slow steps exceed chunks by one or "
            "two: the engine loop stalls admitting and retiring a long prompt.",
            targets(
                (f"{m.WINDOW_SLOW_STEPS}{{{SEL}}}", "slow steps " + GRID_LEGEND),
                (f"{m.WINDOW_CHUNKS}{{{SEL}}}", "chunks " + GRID_LEGEND),
                (f"{m.WINDOW_EXPECTED}{{{SEL}}}", "expected " + GRID_LEGEND),
            ),
            minimum=0,
            decimals=0,
            draw="points",
        ),
        w=8,
    )
    d.add(
        timeseries(
            "Total interference per stream",
            "Extra time one decode stream lost to the last prefill: the sum over window intervals of "
            "(interval - baseline p50). Times D it is the prefill's aggregate cost.",
            targets((f"{m.WINDOW_TOTAL}{{{SEL}}}", GRID_LEGEND)),
            unit="s",
        ),
        w=8,
    )
    d.add(
        timeseries(
            "Injections and windows",
            "Prefill perturbations sent per second by outcome, and windows analysed per second: injected "
            "(active) and production prefills (passive).",
            targets(
                (f"sum by (outcome) (rate({m.INJECTIONS}{{{SEL}}}[{RATE}]))", "injections {{outcome}}"),
                (f"sum by (mode) (rate({m.WINDOWS}{{{SEL}}}[{RATE}]))", "windows analysed {{mode}}"),
            ),
            unit="ops",
            minimum=0,
        ),
        w=24,
        h=6,
    )


def _passive_row(d: Dashboard) -> None:
    """Passive mode: slow runs by outcome, where P came from, traces received, the event model's certainty."""
    d.row("Passive mode (production prefills, run --passive)")
    d.add(
        timeseries(
            "Slow runs by outcome",
            "Runs of slow steps the probes saw per second, by what became of them: published (one production "
            "prefill, a passive window), merged (several prefills in one run), unattributed (no production "
            "prefill ended there: an engine stall), ambiguous (only /metrics, and no pair of scrapes isolated "
            "it), own-probe (the exporter's own probe restart), no-baseline, no-window, out-of-bins, no-budget.",
            targets((f"sum by (outcome) (rate({m.PASSIVE_EVENTS}{{{SEL}}}[{RATE}]))", "{{outcome}}")),
            unit="ops",
            minimum=0,
        ),
        w=8,
    )
    d.add(
        timeseries(
            "Where P came from",
            "Published passive windows per second by the source of their prompt size: otlp (the engine's "
            "request traces), metrics (/metrics counters bracketing the run), cadence (the probes alone).",
            targets((f'sum by (source) (rate({m.PASSIVE_EVENTS}{{{SEL}, outcome="published"}}[{RATE}]))',
                     "{{source}}")),
            unit="ops",
            minimum=0,
        ),
        w=8,
    )
    d.add(
        timeseries(
            "Request traces received",
            "Engine request spans received on POST /v1/traces per second, by whose requests they were, and OTLP "
            "export requests by result. No production spans: point vLLM's --otlp-traces-endpoint here (with "
            "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL=http/protobuf).",
            targets(
                (f"sum by (kind) (rate({m.REQUEST_TRACES}{{{SEL}}}[{RATE}]))", "spans {{kind}}"),
                (f"sum by (result) (rate({m.TRACE_EXPORTS}{{{SEL}}}[{RATE}]))", "exports {{result}}"),
            ),
            unit="ops",
            minimum=0,
        ),
        w=8,
    )

    d.add(
        timeseries(
            "How sure the passive answer is",
            "Passive mode's cost model is fitted on the production prefills event by event (exact D and P; "
            "analysis.passive_model) and refitted as they come. Half-width: half its 95 % bootstrap interval "
            "over its prediction, median over the grid cells the traffic reaches (0.1 = +-10 %); it narrows "
            "about as 1 / sqrt(events). It measures the events' scatter, not a model form that misses the "
            "engine: compare with injection on the same engine once (export-table --mode passive --injected).",
            [target(f"{m.PASSIVE_MODEL_HALFWIDTH}{{{SEL}}}", "95 % half-width {{instance}}")],
            unit="percentunit",
            minimum=0,
        ),
        w=12,
    )
    d.add(
        timeseries(
            "Events behind the passive answer",
            "Production prefills the last fit used, and the cells of the seed's grid (D 1..12, P 512..32768) "
            "the traffic reaches: D and P surrounded by bins of >= 5 events. Cells outside are extrapolations "
            "(pdexporter_passive_model_cell_reached = 0): D below the probes' own decodes, beyond the "
            "concurrency reached, or P beyond the published events' prompts.",
            targets(
                (f"{m.PASSIVE_MODEL_EVENTS}{{{SEL}}}", "events {{instance}}"),
                (f"{m.PASSIVE_MODEL_CELLS}{{{SEL}}}", "cells reached {{instance}}"),
            ),
            minimum=0,
            decimals=0,
        ),
        w=12,
    )
    d.add(
        timeseries(
            "Eager one-chunk steps running slow",
            "The share of the last 5 minutes' launch-bound one-chunk production prefills (one eager chunk bound "
            "by its kernel launches, P ~ 512-3000 on vLLM's defaults) whose chunk step ran at the slow level of "
            "the two their steps fall in. It is the engine's own state, held for seconds, and its share of a "
            "minute moves (26-77 % on one H100, GPU session 37): a one-chunk prompt costs its decodes the slow "
            "level's penalty this share of the time. Empty while the events show no two clear levels.",
            targets(
                (f"{m.PASSIVE_MODEL_LAUNCH_SLOW_SHARE}{{{SEL}}}", "slow share {{instance}}"),
            ),
            unit="percentunit",
            minimum=0,
        ),
        w=24,
    )


def _thresholds_row(d: Dashboard) -> None:
    """The live router thresholds with their 90 % band, the events behind them and their age."""
    d.row("Live router thresholds (run --passive --decision FILE)")
    thr = f'{m.OFFLOAD_THRESHOLD}{{{SEL}, decode_batch_size=~"$decodes"'
    band = timeseries(
        "Offload threshold vs time, with its 90 % interval",
        "The prompt length (non-cached tokens) from which offloading a prefill to a P/D pair wins, per chunk "
        "size B and decode batch D (the $decodes variable), as the exporter recomputes it from the production "
        "prefills it sees (the colocated side, event-fitted) and the two-arm decision.json it was given (the "
        "offloaded arm, the transfer): the same computation as `pdexporter thresholds`. Solid: the threshold; "
        "dashed: its 90 % interval's ends over the bootstrap refits. An interval spanning more than 2x is "
        "undecided: a router should take its upper end (GET /thresholds.yaml does). +Inf: offloading never "
        "wins up to 131072 tokens.",
        targets(
            (f'max by (chunk_size, decode_batch_size) ({thr}, bound="central"}})',
             "B={{chunk_size}} D={{decode_batch_size}}"),
            (f'max by (chunk_size, decode_batch_size) ({thr}, bound="low"}})',
             "B={{chunk_size}} D={{decode_batch_size}} low"),
            (f'max by (chunk_size, decode_batch_size) ({thr}, bound="high"}})',
             "B={{chunk_size}} D={{decode_batch_size}} high"),
        ),
        minimum=0,
        decimals=0,
    )
    band["fieldConfig"]["overrides"].append({
        "matcher": {"id": "byRegexp", "options": ".* (low|high)$"},
        "properties": [{"id": "custom.lineStyle", "value": {"fill": "dash", "dash": [6, 4]}},
                       {"id": "custom.fillOpacity", "value": 0}],
    })
    d.add(band, w=16)
    d.add(
        timeseries(
            "Events behind the threshold, and its age",
            "Production prefills at each D in the fit behind the thresholds (the fit pools every D; a threshold "
            "far from the D the traffic ran rests on the model's extrapolation), and seconds since the "
            "thresholds were last computed (--threshold-every, with the event model's refit; it grows while "
            "no new event comes).",
            targets(
                (f'max by (decode_batch_size) ({m.OFFLOAD_THRESHOLD_EVENTS}{{{SEL}, decode_batch_size=~"$decodes"}})',
                 "events at D={{decode_batch_size}}"),
                (f"time() - max({m.OFFLOAD_THRESHOLD_TIMESTAMP}{{{SEL}}})", "age (s)"),
            ),
            minimum=0,
            decimals=0,
        ),
        w=8,
    )


def _engine_row(d: Dashboard) -> None:
    """The engine being probed: its queue, its KV cache, what it is."""
    d.row("Engine")
    d.add(
        timeseries(
            "Requests running / waiting",
            "The engine's vllm:num_requests_running and vllm:num_requests_waiting, as the exporter last scraped "
            "them. Running includes the probe streams.",
            targets(
                (f"{m.ENGINE_RUNNING}{{{SEL}}}", "running {{instance}}"),
                (f"{m.ENGINE_WAITING}{{{SEL}}}", "waiting {{instance}}"),
            ),
            minimum=0,
            decimals=0,
        ),
        w=9,
    )
    d.add(
        timeseries(
            "KV-cache usage",
            "The engine's KV-cache usage (vllm:kv_cache_usage_perc in vLLM 0.22). High usage at large D risks "
            "preemption, which would distort the measurement.",
            targets((f"{m.ENGINE_KV}{{{SEL}}}", "{{instance}}")),
            unit="percentunit",
            minimum=0,
            maximum=1,
        ),
        w=7,
    )
    d.add(
        info_table(
            "Engine being probed",
            "modelled=true means the embedded engine: its numbers come from a model, not a GPU.",
            f"{m.ENGINE_INFO}{{{SEL}}}",
            ["instance", "engine", "model", "chunk_size", "modelled"],
        ),
        w=8,
    )


def _health_status_panels(d: Dashboard) -> None:
    """The exporter health row's first half: up, the engine scrape, errors, and why up is what it is."""
    d.row("Exporter health")
    d.add(
        stat(
            "Exporter up",
            "pdexporter_up: 1 while the engine answers and the probe streams are running.",
            targets((f"{m.UP}{{{SEL}}}", "{{instance}}")),
            mappings=up_down_mappings(),
            steps=thresholds((None, "red"), (1, "green")),
            graph=False,
        ),
        w=4,
        h=6,
    )
    d.add(
        stat(
            "Engine scrape",
            "1 if the exporter's last scrape of the engine's /metrics worked.",
            targets((f"{m.ENGINE_SCRAPE_OK}{{{SEL}}}", "{{instance}}")),
            mappings=up_down_mappings("OK", "FAILING"),
            steps=thresholds((None, "red"), (1, "green")),
            graph=False,
        ),
        w=4,
        h=6,
    )
    d.add(
        timeseries(
            "Engine scrape duration",
            "How long the exporter's last scrape of the engine's /metrics took.",
            targets((f"{m.ENGINE_SCRAPE_SECONDS}{{{SEL}}}", "{{instance}}")),
            unit="s",
            minimum=0,
        ),
        w=8,
        h=6,
    )
    d.add(
        timeseries(
            "Errors by kind",
            "Failures per second: connect, http, timeout, protocol (broken SSE) and measurement (no valid window).",
            targets((f"sum by (kind) (rate({m.ERRORS}{{{SEL}}}[{RATE}]))", "{{kind}}")),
            unit="ops",
            minimum=0,
        ),
        w=8,
        h=6,
    )
    d.add(
        stat(
            "Why up is what it is",
            "pdexporter_up_reason: the current reason (ok, starting, engine-unreachable, engine-timeout, "
            "engine-http-error, engine-protocol-error, probes-stalled, probes-restarting, stopping). A stalled "
            "probe reads probes-stalled here while up stays what the engine says (docs/reliability.md).",
            targets((f"{m.UP_REASON}{{{SEL}}} == 1", "{{reason}} {{instance}}")),
            graph=False,
            text_mode="name",
        ),
        w=8,
        h=6,
    )


def _health_activity_panels(d: Dashboard) -> None:
    """The exporter health row's second half: skipped windows, trace rejections, probe streams, build,
    the timestamp error bound."""
    d.add(
        timeseries(
            "Windows skipped by kind",
            "Windows that failed (no window came) per second, by the kind of failure: a silent exporter "
            "(up = 1, no new windows) shows here.",
            targets((f"sum by (kind) (rate({m.WINDOWS_SKIPPED}{{{SEL}}}[{RATE}]))", "{{kind}}")),
            unit="ops",
            minimum=0,
        ),
        w=8,
        h=6,
    )
    d.add(
        timeseries(
            "Trace receiver rejections",
            "OTLP requests the trace receiver refused per second, by reason (unauthorized, rate-limited, busy, "
            "too-large, bad-encoding, ...): its bounds at work (docs/security.md).",
            targets((f"sum by (reason) (rate({m.TRACE_REJECTIONS}{{{SEL}}}[{RATE}]))", "{{reason}}")),
            unit="ops",
            minimum=0,
        ),
        w=8,
        h=6,
    )
    d.add(
        timeseries(
            "Probe streams",
            "Probe streams decoding now, streams started per second (they restart as they finish), and probe "
            "tokens received per second.",
            targets(
                (f"{m.PROBE_STREAMS}{{{SEL}}}", "streams decoding {{instance}}"),
                (f"rate({m.PROBE_STREAMS_STARTED}{{{SEL}}}[{RATE}])", "streams started/s {{instance}}"),
                (f"rate({m.PROBE_TOKENS}{{{SEL}}}[{RATE}])", "tokens/s {{instance}}"),
            ),
            minimum=0,
        ),
        w=16,
        h=6,
    )
    d.add(
        stat(
            "Build",
            "pdexporter version of each exporter.",
            targets((f"{m.BUILD_INFO}{{{SEL}}}", "{{version}}")),
            graph=False,
            text_mode="name",
        ),
        w=8,
        h=6,
    )
    d.add(
        timeseries(
            "Probe timestamp error bound",
            "How late the probe loop stamps a readable socket (p50 / p99): the error bar on every token "
            "timestamp, hence on every TPOT above. Compare it with the decode step time.",
            [
                target(
                    f"histogram_quantile({q}, sum by (le) (rate({m.PROBE_TIMESTAMP_DELAY}_bucket{{{SEL}}}[{RATE}])))",
                    f"p{round(q * 100)}",
                    ref_id=ref,
                )
                for ref, q in (("A", 0.5), ("B", 0.99))
            ],
            unit="s",
            minimum=0,
        ),
        w=24,
        h=6,
    )


def build() -> Json:
    """The live dashboard, row by row."""
    d = _dashboard()
    _probe_tpot_row(d)
    _last_window_panels(d)
    _prefill_row(d)
    _passive_row(d)
    _thresholds_row(d)
    _engine_row(d)
    _health_status_panels(d)
    _health_activity_panels(d)
    return d.build()
