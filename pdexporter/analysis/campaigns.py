"""Held-out campaigns (issue 30): a model's error is quoted only on a GPU campaign it was never
fitted on, and what moves between campaigns is carried into every interval.

A *campaign* is one GPU session's measurements of one engine setup. Each results directory says
which it belongs to in a `campaign.yaml` (`id`, `date`, `role`: `fit` or `validation`, `note`).
The records of a validation campaign are read by no fit (`check_fit_inputs`, called by every
joined fit): they only score models, and their errors, with every other campaign's, measure the
campaign variation below.

**Leave one campaign out.** For every campaign c, the models are fitted on the fit campaigns other
than c and predict c's points; a validation campaign is predicted by the models fitted on every fit
campaign. At each held-out point the log ratio r = log(measured / predicted) is what a campaign the
models never saw will see. Its root mean square per arm and regime (`decision_eval.cost_regime`:
a CUDA-graph step, an eager step bound by the host's launches, one bound by the GPU's work), over
the held-out points of *every* campaign (a validation campaign's points are residuals of models
that never read them, as a fit campaign's left-out points are; no cost model reads them), is the
**campaign variation** s, carried into `decision.json` (`campaign_variation`): each bootstrap
replicate's arm cost is multiplied by exp(s z_r), with z_r fixed standard normal draws stored with
the replicates (`replicates.campaign`), so every interval, verdict share and threshold carries it.
A regime with fewer than `MIN_REGIME_POINTS` held-out points takes the arm's pooled s.

**Coverage** is the share of held-out measurements inside their 90 % interval, the interval built
with the s estimated from the *other* campaigns' residuals (nested: the campaign scored never sets
its own width).

Pure: samples and documents in, data out; `load_campaign`, `find_campaigns`, `load_variation`
and `write_outputs` are the file edges; `job.validate_campaigns` wires it to the fits.
"""

from __future__ import annotations

import datetime
import functools
import math
import re
import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np
import yaml

from pdexporter._internal.text import read_utf8
from pdexporter.analysis.decision_eval import (
    CAMPAIGN_ARMS,
    campaign_log_sd,
    chunk_context,
    cost_regime,
    evaluate_arms,
    replicate_costs,
)
from pdexporter.analysis.table import ConfigSamples, build_table, pooled
from pdexporter.analysis.thresholds import array_stack
from pdexporter.errors import ConfigError, RecordError

__all__ = [
    "CAMPAIGN_FILE",
    "MIN_REGIME_POINTS",
    "ROLES",
    "Campaign",
    "HeldOutPoint",
    "campaign_draws",
    "campaign_order",
    "carry_variation",
    "check_fit_inputs",
    "coverage_summary",
    "find_campaigns",
    "fold_variation",
    "headline",
    "held_out_document",
    "held_out_points",
    "load_campaign",
    "load_variation",
    "profile_variation",
    "render_markdown",
    "variation_from",
    "variation_line",
    "write_outputs",
]

CAMPAIGN_FILE = "campaign.yaml"
ROLES = ("fit", "validation")
MIN_REGIME_POINTS = 8  # fewer held-out points in a regime: it takes its arm's pooled variation
COVERAGE_LEVEL = 0.90  # the intervals scored: 5th..95th percentile


@dataclass(frozen=True)
class Campaign:
    """One GPU campaign: its id, date and role, and its results directories by arm."""

    id: str
    date: str
    role: str
    colocated: tuple[str, ...] = ()
    offloaded: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()


def _campaign_date(path: Path, value: Any) -> str:
    """A campaign's date as YYYY-MM-DD (YAML reads an unquoted one as a date; a quoted one must be
    a real day in that form); else one line naming the file and the value."""
    if isinstance(value, datetime.date):  # a datetime too: kept as YAML gave it
        return str(value)
    text = str(value).strip()
    if re.fullmatch(r"\d{4}-\d{2}-\d{2}", text):
        try:
            return datetime.date.fromisoformat(text).isoformat()
        except ValueError:
            pass
    raise RecordError(f"{path}: date: {value!r:.60} is not a date (YYYY-MM-DD)")


def load_campaign(results_dir: str | Path) -> dict[str, str] | None:
    """The `campaign.yaml` of a results directory (None: the directory says nothing)."""
    path = Path(results_dir) / CAMPAIGN_FILE
    if not path.is_file():
        return None
    try:
        data = yaml.safe_load(read_utf8(path, RecordError))  # not UTF-8: one line naming the file
    except yaml.YAMLError as exc:
        raise RecordError(f"{path}: not valid YAML ({str(exc).splitlines()[0]})") from None
    if not isinstance(data, dict):
        raise RecordError(f"{path}: expected a mapping with id, date, role")
    for key in ("id", "date", "role"):
        if data.get(key) is None or isinstance(data.get(key), dict | list) or str(data.get(key)).strip() == "":
            raise RecordError(f"{path}: {key}: missing (every campaign.yaml names id, date and role)")
    if data["role"] not in ROLES:
        raise RecordError(f"{path}: role: {data['role']!r} is not one of {', '.join(ROLES)}")
    return {"id": str(data["id"]), "date": _campaign_date(path, data["date"]), "role": data["role"],
            "note": str(data.get("note") or "")}


def check_fit_inputs(results_dirs: Sequence[str | Path]) -> list[str]:
    """Refuse a validation campaign's directory among the inputs of a joined fit; the campaign
    ids the fit rests on (those the directories name), in order."""
    ids: list[str] = []
    for directory in results_dirs:
        info = load_campaign(directory)
        if info is None:
            continue
        if info["role"] == "validation" and len(results_dirs) > 1:
            raise RecordError(f"{directory}: a validation campaign ({info['id']}, {CAMPAIGN_FILE} role: validation): "
                              "no fit reads it; score models on it with `pdexporter validate`")
        if info["id"] not in ids:
            ids.append(info["id"])
    return ids


def find_campaigns(pairs: Sequence[tuple[str | Path, str]]) -> list[Campaign]:
    """Campaigns from (results directory, arm) pairs, grouped by their `campaign.yaml` id."""
    found: dict[str, dict[str, Any]] = {}
    for directory, arm in pairs:
        if arm not in CAMPAIGN_ARMS:
            raise RecordError(f"{directory}: arm {arm!r} is not one of {', '.join(CAMPAIGN_ARMS)}")
        info = load_campaign(directory)
        if info is None:
            raise RecordError(f"{directory}: no {CAMPAIGN_FILE} (id, date, role) saying which campaign it is")
        entry = found.setdefault(info["id"], {"date": info["date"], "role": info["role"], "colocated": [],
                                              "offloaded": [], "notes": []})
        if entry["role"] != info["role"]:
            raise RecordError(f"{directory}: campaign {info['id']} is role {info['role']} here but {entry['role']} "
                              "in another directory")
        entry[arm].append(str(directory))
        if info["note"]:
            entry["notes"].append(info["note"])
    return [Campaign(cid, e["date"], e["role"], tuple(e["colocated"]), tuple(e["offloaded"]), tuple(e["notes"]))
            for cid, e in found.items()]


# ---------------------------------------------------------------------------------------------
# Held-out predictions


@dataclass
class HeldOutPoint:
    """One measured point of a campaign, predicted by models that never read that campaign."""

    campaign: str
    role: str
    arm: str  # colocated | offloaded
    chunk_size: int
    decode_batch_size: int
    new_prefill_tokens: int
    regime: str
    measured_ms: float
    predicted_ms: float
    fitted_on: tuple[str, ...]
    replicate_ms: list[float] = field(default_factory=list, repr=False)  # bootstrap replicates, no variation

    @property
    def log_ratio(self) -> float:
        return math.log(self.measured_ms / self.predicted_ms)

    @property
    def error_pct(self) -> float:
        """The prediction's error relative to the measurement (signed: + over-predicted)."""
        return 100.0 * (self.predicted_ms - self.measured_ms) / self.measured_ms

    def to_dict(self) -> dict[str, Any]:
        return {"campaign": self.campaign, "role": self.role, "arm": self.arm, "chunk_size": self.chunk_size,
                "decode_batch_size": self.decode_batch_size, "new_prefill_tokens": self.new_prefill_tokens,
                "regime": self.regime, "measured_ms": round(self.measured_ms, 3),
                "predicted_ms": round(self.predicted_ms, 3),
                "error_pct": round(self.error_pct, 2),
                "fitted_on": list(self.fitted_on)}


Fit = Callable[[Sequence[ConfigSamples], Sequence[ConfigSamples]], dict[str, Any] | None]
Samples = Mapping[str, Mapping[str, Sequence[ConfigSamples]]]  # campaign id -> arm -> samples


def _measured(samples: Sequence[ConfigSamples]) -> dict[tuple[int, int, int], float]:
    table = build_table(samples)
    out = {}
    for row in table.to_dict(orient="records"):
        value = row.get("aggregate_interference_ms")
        d = int(row["decode_batch_size"])
        if d >= 1 and isinstance(value, int | float) and math.isfinite(value) and value > 0:
            out[(int(row["chunk_size"]), d, int(row["new_prefill_tokens"]))] = float(value)
    return out


def _pool(samples: Samples, ids: Sequence[str], arm: str) -> list[ConfigSamples]:
    """The repetitions of every point the campaigns `ids` measured on `arm`, pooled per point."""
    merged: dict[tuple[int, int, int], ConfigSamples] = {}
    for cid in ids:
        for s in samples[cid].get(arm, ()):
            merged[s.key] = pooled(merged[s.key], s) if s.key in merged else s
    return list(merged.values())


def held_out_points(campaigns: Sequence[Campaign], samples: Samples, fit: Fit,
                    tick: Callable[[str], None] | None = None) -> list[HeldOutPoint]:
    """Every campaign's points predicted by the models fitted on the other fit campaigns (`fit`:
    colocated and offloaded samples in, a decision document out, or None where they do not fit)."""
    fit_ids = [c.id for c in campaigns if c.role == "fit"]
    points: list[HeldOutPoint] = []
    fitted: dict[tuple[str, ...], dict[str, Any] | None] = {}  # every validation campaign shares one train set
    for c in campaigns:
        train = tuple(i for i in fit_ids if i != c.id)
        if not train:
            continue
        if train not in fitted:
            col, off = _pool(samples, train, "colocated"), _pool(samples, train, "offloaded")
            fitted[train] = fit(col, off) if col else None
        doc = fitted[train]
        if tick:
            tick(c.id)
        if doc is None:
            continue
        for arm in CAMPAIGN_ARMS:
            if arm == "offloaded" and not doc.get("two_arm"):
                continue
            measured = _measured(samples[c.id].get(arm, ()))
            points.extend(_predict(doc, c, arm, measured, train))
    return points


def _predict(doc: dict[str, Any], c: Campaign, arm: str, measured: Mapping[tuple[int, int, int], float],
             train: tuple[str, ...]) -> list[HeldOutPoint]:
    key: Literal["colocated_cost_ms", "offloaded_cost_ms"] = (
        "colocated_cost_ms" if arm == "colocated" else "offloaded_cost_ms")
    kept = []
    for (b, d, p), value in sorted(measured.items()):
        try:
            contexts = (chunk_context(doc, d, p, b), chunk_context(doc, 0, p, b))
        except ValueError:
            continue
        central = evaluate_arms(doc, d, p, b, contexts=contexts)[key]
        if central and central > 0:
            kept.append((b, d, p, value, central, contexts))
    reps = replicate_costs(doc, key, [(d, p, b, ctx) for b, d, p, _, _, ctx in kept], stack=array_stack())
    return [HeldOutPoint(c.id, c.role, arm, b, d, p, cost_regime(doc, ctx[0]), value, central, train, r)
            for (b, d, p, value, central, ctx), r in zip(kept, reps, strict=True)]


# ---------------------------------------------------------------------------------------------
# Campaign variation and coverage


def variation_from(points: Sequence[HeldOutPoint], *, exclude: str | None = None) -> dict[str, dict[str, Any]]:
    """s per arm and regime: the root mean square of the held-out log ratios of every campaign (less
    `exclude`'s), with the campaigns and point counts it rests on. A validation campaign counts as a
    fit campaign's left-out points do: both are errors of models that never read them; the more
    campaigns, the more of what moves between them (a host's launch level) the width has seen."""
    out: dict[str, dict[str, Any]] = {}
    for arm in CAMPAIGN_ARMS:
        use = [q for q in points if q.arm == arm and q.campaign != exclude]
        if not use:
            continue
        pooled = _rms([q.log_ratio for q in use])
        regimes: dict[str, float] = {}
        counts: dict[str, int] = {}
        for regime in sorted({q.regime for q in use}):
            these = [q.log_ratio for q in use if q.regime == regime]
            counts[regime] = len(these)
            regimes[regime] = _rms(these) if len(these) >= MIN_REGIME_POINTS else pooled
        out[arm] = {"log_sd": round(pooled, 5), "by_regime": {k: round(v, 5) for k, v in regimes.items()},
                    "points": len(use), "points_by_regime": counts,
                    "campaigns": sorted({q.campaign for q in use}, key=campaign_order)}
    return out


def campaign_order(cid: str) -> tuple[Any, ...]:
    """Campaign ids in the order of their numbers ("s9" before "s11"), not of their letters."""
    return tuple(int(part) if part.isdigit() else part for part in re.split(r"(\d+)", cid))


def _rms(values: Sequence[float]) -> float:
    return math.sqrt(sum(v * v for v in values) / len(values)) if values else 0.0


@functools.lru_cache(maxsize=8)
def campaign_draws(n: int, seed: int = 20261203) -> list[dict[str, float]]:
    """Fixed standard normal draws per bootstrap replicate, one per arm, independent between the
    arms: the normal quantiles at (i + 0.5) / n, each arm in its own fixed random order."""
    normal = statistics.NormalDist()
    quantiles = [normal.inv_cdf((i + 0.5) / n) for i in range(n)]
    rng = np.random.default_rng(seed)
    orders = {arm: rng.permutation(n) for arm in CAMPAIGN_ARMS}
    return [{arm: round(quantiles[int(orders[arm][i])], 6) for arm in CAMPAIGN_ARMS} for i in range(n)]


Z90 = 1.6449  # the normal quantile of the 90 % band's edges (COVERAGE_LEVEL)


def inside_log_band(measured: float, predicted: float, log_sd: float) -> bool:
    """Whether `measured` lies inside `predicted` x exp(+-Z90 s), the 90 % band the campaign variation s
    gives a prediction that has no replicates of its own (the embedded engine's, a projection's)."""
    return abs(math.log(measured / predicted)) <= Z90 * log_sd


def carry_variation(replicates: Any, log_sd: Any, arm: str = "colocated") -> np.ndarray:
    """Bootstrap replicates with the campaign variation carried, as decision.json's intervals carry
    it: replicate r (axis 0 of `replicates`) times exp(s z_r), z_r the arm's fixed draw
    (`campaign_draws`), s the log sd `pdexporter validate` measured (`decision_eval.campaign_log_sd`;
    a scalar or one per column). The held-out coverage, the passive event model's intervals and
    decision.json all widen by this one rule."""
    values = np.asarray(replicates, dtype=np.float64)
    n = values.shape[0] if values.ndim else 0
    if n == 0:
        return values
    z = np.array([draw[arm] for draw in campaign_draws(n)]).reshape((n,) + (1,) * (values.ndim - 1))
    return values * np.exp(np.asarray(log_sd, dtype=np.float64) * z)


def fold_variation(doc: dict[str, Any], variation: Mapping[str, Any], held_out: Mapping[str, Any] | None = None,
                   ) -> dict[str, Any]:
    """The decision document with the campaign variation carried: `campaign_variation` (s per arm
    and regime, what it rests on, the held-out errors) and one draw per replicate."""
    n = len((doc.get("replicates") or {}).get("model") or ())
    out = dict(doc)
    out["campaign_variation"] = {"scheme": "leave-one-campaign-out", **{k: dict(v) for k, v in variation.items()
                                                                       if k in CAMPAIGN_ARMS}}
    if variation.get("source"):
        out["campaign_variation"]["source"] = str(variation["source"])
    if held_out:
        out["campaign_variation"]["held_out"] = dict(held_out)
    if n:
        out["replicates"] = dict(doc["replicates"], campaign=campaign_draws(n))
    return out


def _interval(point: HeldOutPoint, s: float) -> tuple[float, float]:
    values = sorted(carry_variation(point.replicate_ms, s, point.arm).tolist()) or [point.predicted_ms]
    lo_q, hi_q = (1 - COVERAGE_LEVEL) / 2, 1 - (1 - COVERAGE_LEVEL) / 2
    lo = min(float(np.quantile(values, lo_q)), point.predicted_ms)
    hi = max(float(np.quantile(values, hi_q)), point.predicted_ms)
    return lo, hi


def coverage_summary(points: Sequence[HeldOutPoint]) -> dict[str, Any]:
    """Per arm and campaign: MAPE, median and max error, and the share of measurements inside the
    90 % interval without and with the campaign variation (nested: s from the other campaigns)."""
    rows: list[dict[str, Any]] = []
    summary: dict[str, Any] = {"level": COVERAGE_LEVEL, "arms": {}, "points": rows}
    for arm in CAMPAIGN_ARMS:
        arm_points = [q for q in points if q.arm == arm]
        if not arm_points:
            continue
        per: dict[str, Any] = {}
        for cid in sorted({q.campaign for q in arm_points}, key=campaign_order):
            these = [q for q in arm_points if q.campaign == cid]
            var = variation_from(points, exclude=cid).get(arm)
            inside_before = inside_after = 0
            by_regime: dict[str, list[tuple[float, bool]]] = {}  # regime -> (|error| %, inside) per point
            for q in these:
                lo, hi = _interval(q, 0.0)
                inside_before += lo <= q.measured_ms <= hi
                s = campaign_log_sd({arm: var} if var else {}, arm, q.regime)
                lo2, hi2 = _interval(q, s)
                inside = lo2 <= q.measured_ms <= hi2
                inside_after += inside
                by_regime.setdefault(q.regime, []).append((abs(q.error_pct), inside))
                rows.append({**q.to_dict(), "interval_bootstrap": [round(lo, 3), round(hi, 3)],
                             "interval_90": [round(lo2, 3), round(hi2, 3)], "inside": inside,
                             "variation_log_sd": round(s, 5)})
            errors = [e for scored in by_regime.values() for e, _ in scored]
            per[cid] = {"role": these[0].role, "points": len(these), "fitted_on": list(these[0].fitted_on),
                        "mape_pct": round(statistics.fmean(errors), 2),
                        "median_error_pct": round(statistics.median(errors), 2),
                        "max_error_pct": round(max(errors), 2),
                        "coverage_bootstrap_only": round(inside_before / len(these), 3),
                        "coverage": round(inside_after / len(these), 3),
                        # where the cost is set (a CUDA graph, the host's launches, the GPU's work):
                        # the launch-bound points carry what moves between hosts, the others little
                        "by_regime": {r: {"points": len(v), "mape_pct": round(statistics.fmean(e for e, _ in v), 2),
                                          "coverage": round(sum(i for _, i in v) / len(v), 3)}
                                      for r, v in sorted(by_regime.items())}}
        fit_rows = [v for v in per.values() if v["role"] == "fit"]
        n_fit = sum(v["points"] for v in fit_rows)
        summary["arms"][arm] = {
            "campaigns": per,
            "leave_one_campaign_out": {
                "points": n_fit,
                "mape_pct": round(sum(v["mape_pct"] * v["points"] for v in fit_rows) / n_fit, 2) if n_fit else None,
                "coverage": round(sum(v["coverage"] * v["points"] for v in fit_rows) / n_fit, 3) if n_fit else None,
            },
        }
    return summary


def headline(summary: Mapping[str, Any]) -> dict[str, Any]:
    """What a decision document quotes: per arm, the held-out MAPE and coverage over the fit
    campaigns (leave one out) and over each validation campaign, with the campaigns named."""
    out: dict[str, Any] = {}
    for arm, body in summary.get("arms", {}).items():
        loco = body["leave_one_campaign_out"]
        entry = {"leave_one_campaign_out": {**loco, "campaigns": sorted(
            (k for k, v in body["campaigns"].items() if v["role"] == "fit"), key=campaign_order)}}
        for cid, v in body["campaigns"].items():
            if v["role"] == "validation":
                entry.setdefault("validation", {})[cid] = {k: v[k] for k in ("points", "mape_pct", "coverage",
                                                                             "fitted_on")}
        out[arm] = entry
    return out



# ---------------------------------------------------------------------------------------------
# The entry point (`pdexporter validate`)

HELD_OUT_SCHEMA = "pdexporter.held-out/v1"


def held_out_document(campaigns: Sequence[Campaign], points: Sequence[HeldOutPoint]) -> dict[str, Any]:
    """What `pdexporter validate` writes (held_out.json): the campaigns, the variation to carry,
    the headline errors and every held-out point."""
    summary = coverage_summary(points)
    return {
        "schema": HELD_OUT_SCHEMA,
        "scheme": "leave-one-campaign-out",
        "campaigns": [{"id": c.id, "date": c.date, "role": c.role, "colocated": list(c.colocated),
                       "offloaded": list(c.offloaded), "notes": list(c.notes)} for c in campaigns],
        "variation": variation_from(points),
        "headline": headline(summary),
        "summary": summary,
    }



def load_variation(path: str | Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """(variation, headline) from a `pdexporter validate` output (held_out.json)."""
    import json

    p = Path(path)
    try:
        doc = json.loads(p.read_text())
    except (OSError, ValueError) as exc:
        raise RecordError(f"{p}: cannot read a held-out document ({exc})") from None
    if not isinstance(doc, dict) or doc.get("schema") != HELD_OUT_SCHEMA:
        raise RecordError(f"{p}: schema: expected {HELD_OUT_SCHEMA} (the held_out.json `pdexporter validate` writes)")
    for arm, v in (doc.get("variation") or {}).items():
        s = v.get("log_sd") if isinstance(v, dict) else None
        if not isinstance(s, int | float) or not math.isfinite(s) or s < 0:
            raise RecordError(f"{p}: variation.{arm}.log_sd: {s!r} is not a finite number >= 0")
    return {**doc["variation"], "source": str(p)}, doc.get("headline") or {}


def profile_variation(samples: Sequence[ConfigSamples]) -> tuple[dict[str, Any], dict[str, Any]] | None:
    """A table the embedded engine made: the campaign variation of the profile it made it with,
    measured on the real engine's GPU campaigns (`sim.profile.CampaignVariation`), as (variation,
    headline) like `load_variation`'s, the headline empty (no model was held out of anything here).
    None for a measured table, one of several profiles, or a profile without one (or not found)."""
    from pdexporter.sim.profile import load_profile

    names = {s.profile for s in samples}
    if not samples or not all(s.modelled for s in samples) or len(names) != 1:
        return None
    name = names.pop()
    if name is None:
        return None
    try:
        measured = load_profile(name).campaign_variation
    except ConfigError:
        return None
    if measured is None:
        return None
    if measured.borrowed_from:
        source = (f"profile {name}, borrowed from {measured.borrowed_from} (measured on its real engine's campaigns, "
                  f"{measured.source}; this model or GPU was not)")
    else:
        source = f"profile {name}, measured on the real engine ({measured.source})"
    return {**measured.arms(), "source": source}, {}


def variation_line(variation: Mapping[str, Any]) -> str:
    """One line for a person: what the intervals carry (s per regime of the colocated arm), and from where."""
    arm = variation.get("colocated") or variation.get("offloaded") or {}
    regimes = ", ".join(f"{k} {v:.2f}" for k, v in (arm.get("by_regime") or {}).items())
    return (f"intervals carry the campaign-to-campaign variation (log sd {regimes or arm.get('log_sd')}, "
            f"{len(arm.get('campaigns') or ())} GPU campaigns) of {variation.get('source', 'held_out.json')}")


def render_markdown(result: Mapping[str, Any]) -> str:
    """The held-out errors and coverage as a Markdown table, one row per arm and campaign."""
    lines = ["| arm | campaign | role | fitted on | points | MAPE % | median % | max % | in 90 % interval "
             "(bootstrap only) | in 90 % interval (with campaign variation) |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for arm, body in result["summary"]["arms"].items():
        for cid, v in body["campaigns"].items():
            lines.append(f"| {arm} | {cid} | {v['role']} | {', '.join(v['fitted_on'])} | {v['points']} | "
                         f"{v['mape_pct']:.1f} | {v['median_error_pct']:.1f} | {v['max_error_pct']:.1f} | "
                         f"{v['coverage_bootstrap_only']:.0%} | {v['coverage']:.0%} |")
    lines += ["", "By regime (the step that sets the cost: `graph` a CUDA graph, `launch` one eager chunk bound by "
              "the host's launches, `compute` the GPU's work): points, MAPE, share inside the 90 % interval.", "",
              "| arm | campaign | compute | launch | graph |", "|---|---|---|---|---|"]
    for arm, body in result["summary"]["arms"].items():
        for cid, v in body["campaigns"].items():
            cells = [(f"{r['points']}: {r['mape_pct']:.1f} %, {r['coverage']:.0%}" if r else "–")
                     for r in (v.get("by_regime", {}).get(k) for k in ("compute", "launch", "graph"))]
            lines.append(f"| {arm} | {cid} | {' | '.join(cells)} |")
    lines.append("")
    for arm, v in result["variation"].items():
        regimes = ", ".join(f"{k} {s:.3f} ({v['points_by_regime'][k]} points)" for k, s in v["by_regime"].items())
        lines.append(f"- campaign variation, {arm}: log sd {v['log_sd']:.3f} pooled; by regime: {regimes}; "
                     f"from {', '.join(v['campaigns'])}")
    return "\n".join(lines) + "\n"


def write_outputs(result: Mapping[str, Any], out_dir: str | Path) -> list[Path]:
    """held_out.json (everything), held_out.csv (one row per held-out point), held_out.md."""
    import pandas as pd

    from pdexporter._internal.atomic import atomic_write_json, atomic_write_text

    out = Path(out_dir)
    paths = [out / "held_out.json", out / "held_out.csv", out / "held_out.md"]
    atomic_write_json(paths[0], dict(result))
    atomic_write_text(paths[1], pd.DataFrame(result["summary"]["points"]).to_csv(index=False))
    atomic_write_text(paths[2], "# Held-out campaigns (leave one campaign out)\n\n" + render_markdown(result))
    return paths
