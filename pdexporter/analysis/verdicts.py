"""The verdict commands as jobs over a decision document (`decision.json`, read and checked by
`load_decision`): `decide` (offload this prefill or keep it local, `decide_job`) and `thresholds`
(per (B, D), the prefill length from which offloading wins, `thresholds_job`). Each answers a
`Rendered`: the result's lines (stdout) and the notes beside it (stderr)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pdexporter._internal.finite import NotFinite, loads_finite
from pdexporter._internal.sheet import Plain, Shown
from pdexporter._internal.text import plural, read_utf8
from pdexporter.analysis import DECISION_JSON, DECISION_SCHEMA
from pdexporter.engines import ChunkRule
from pdexporter.errors import ConfigError

if TYPE_CHECKING:
    from pdexporter.analysis.decision_eval import Verdict

__all__ = [
    "MODELLED_NOTE", "Decided", "Rendered", "Thresholds", "chunk_rule_of", "decide_job", "load_decision",
    "thresholds_job",
]


MODELLED_NOTE = "[yellow]MODELLED: the model was fitted on data from a model, not a GPU[/]"


@dataclass
class Rendered:
    out: list[str] = field(default_factory=list)  # the result (stdout)
    notes: list[Shown] = field(default_factory=list)  # warnings and notes beside it (stderr)


def load_decision(path: Path, flag: str = "--model") -> dict[str, Any]:
    """A decision.json, every field as the shipped schema says and every number finite; else one
    line naming `flag`, the file and why."""
    if not path.exists():
        raise ConfigError(f"{flag} {path}: no such file (write one with `pdexporter export-table`)")
    try:
        text = read_utf8(path, ConfigError)  # cannot read, or not UTF-8: one line naming the file
    except ConfigError as exc:
        raise ConfigError(f"{flag} {exc}") from None
    try:
        doc = loads_finite(text)  # NaN coefficients gave a "decided" verdict
    except NotFinite as exc:
        raise ConfigError(f"{flag} {path}: {exc}") from None
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{flag} {path}: not valid JSON (line {exc.lineno}: {exc.msg})") from None
    if not isinstance(doc, dict) or doc.get("schema") != DECISION_SCHEMA:
        found = doc.get("schema") if isinstance(doc, dict) else type(doc).__name__
        hint = (" (written by an older pdexporter: run export-table on its results again)"
                if found == "pdexporter.decision/v1" else "")
        raise ConfigError(f"{flag} {path}: schema {found!r}, expected {DECISION_SCHEMA!r}{hint}")
    from pdexporter.analysis.decision_schema import validate_decision

    validate_decision(doc, f"{flag} {path}")  # every field as the shipped schema says, every number finite
    return doc


def chunk_rule_of(doc: dict[str, Any]) -> ChunkRule:
    """The engine's chunk rule the document was fitted under (its `chunk_rule`; a document without
    one: the default rule, the decodes taking their token of the budget first)."""
    names = {f.name for f in fields(ChunkRule)}
    return ChunkRule(**{k: v for k, v in (doc.get("chunk_rule") or {}).items() if k in names})


def _check_modes(mode: str | None, regime: str) -> None:
    if mode not in (None, "two-arm", "seed"):
        raise ConfigError(f"--mode {mode!r}: expected two-arm or seed")
    if regime not in ("nominal", "degraded"):
        raise ConfigError(f"--transfer-regime {regime!r}: expected nominal or degraded")


# -- decide ---------------------------------------------------------------------------------------

@dataclass
class Decided:
    doc: dict[str, Any]
    verdict: Verdict
    measured: dict[str, Any] | None
    d: int
    p: int
    b: int

    def to_json(self) -> str:
        return json.dumps({**self.verdict, "decode_batch_size": self.d, "new_prefill_tokens": self.p,
                           "chunk_size": self.b, "modelled": self.doc.get("modelled", False),
                           "measured": self.measured}, indent=2)

    def render(self) -> Rendered:
        return (_two_arm if self.verdict["mode"] == "two-arm" else _seed)(self)


def decide_job(d: int, p: int, b: int, *, transfer_ms: float | None = None, model: Path | None = None,
               results: Path | None = None, offloaded: Path | None = None, tpot_slo_ms: float | None = None,
               ttft_slo_ms: float | None = None, mode: str | None = None, regime: str = "nominal") -> Decided:
    """`pdexporter decide`: the verdict for D decodes, a P-token prefill, chunk size B, from a
    decision.json (`model`, default results/decision.json) or fitted now from `results`."""
    if model is not None and results is not None:
        raise ConfigError("give --model or --results, not both")
    if offloaded is not None and results is None:
        raise ConfigError("--offloaded: only with --results (a decision.json carries both arms already)")
    _check_modes(mode, regime)
    measured: dict[str, Any] | None = None
    if results is not None:
        doc, measured = _fit_from(results, d, p, b, offloaded)
    else:
        doc = load_decision(model or Path("results") / DECISION_JSON)
    if chunk_rule_of(doc).problem(b, d):
        raise ConfigError(f"--decode-batch-size {d} with --chunk-size {b}: no room for a prefill chunk")
    if mode == "two-arm" and not doc.get("two_arm"):
        raise ConfigError("--mode two-arm: the decision has one arm only (export-table RESULTS --offloaded DIR, or "
                          "decide --results RESULTS --offloaded DIR)")
    if (tpot_slo_ms is not None or ttft_slo_ms is not None) and (mode == "seed" or not doc.get("two_arm")):
        raise ConfigError("--tpot-slo-ms/--ttft-slo-ms: SLOs need the two-arm verdict (both arms measured)")
    from pdexporter.analysis.breakeven import evaluate_decision

    degraded = ((doc.get("two_arm") or {}).get("terms") or {}).get("transfer", {}).get("degraded")
    if regime == "degraded" and not degraded:
        raise ConfigError("--transfer-regime degraded: the decision's transfer had no degraded windows")
    verdict = evaluate_decision(doc, d, p, b, transfer_ms, tpot_slo_ms=tpot_slo_ms, ttft_slo_ms=ttft_slo_ms,
                                mode=mode, regime=regime)
    if degraded and regime == "nominal" and verdict["mode"] == "two-arm" and transfer_ms is None:
        other = evaluate_decision(doc, d, p, b, tpot_slo_ms=tpot_slo_ms, ttft_slo_ms=ttft_slo_ms, mode=mode,
                                  regime="degraded", intervals=False)
        verdict["degraded_regime"] = {"offload": other["offload"], "verdict": other["verdict"],
                                      "share_of_windows": degraded.get("share_of_windows"),
                                      "gb_per_s": degraded.get("gb_per_s")}
    return Decided(doc, verdict, measured, d, p, b)


def _fit_from(results: Path, d: int, p: int, b: int,
              offloaded: Path | None = None) -> tuple[dict[str, Any], dict[str, Any] | None]:
    from pdexporter.analysis.job import analyse, load_results

    off = load_results(offloaded) if offloaded is not None else None
    analysis = analyse(load_results(results), source=str(results), offloaded=off,
                       offloaded_source=str(offloaded) if offloaded is not None else "")
    if analysis.decision is None:
        raise ConfigError(f"--results {results}: no grid point with D >= 1 and a measured cost; nothing to fit")
    table = analysis.table
    row = table[(table["chunk_size"] == b) & (table["decode_batch_size"] == d) & (table["new_prefill_tokens"] == p)]
    measured = None
    if len(row) and row["aggregate_interference_ms"].notna().iloc[0]:
        measured = {"aggregate_interference_ms": float(row["aggregate_interference_ms"].iloc[0]),
                    "reps": int(row["reps"].iloc[0])}
    return analysis.decision, measured


def _iv(interval: list[float] | None, signed: bool = False) -> str:
    """' (90 %: a..b ms)' for an interval; differences keep their sign, durations never have one."""
    if not interval:
        return ""
    lo, hi = interval
    if signed:
        return f" (90 %: {lo:+.0f}..{hi:+.0f} ms)"
    return f" (90 %: {max(lo, 0.0):.1f}..{max(hi, 0.0):.1f} ms)"


def _seed(x: Decided) -> Rendered:
    v, doc, d, b = x.verdict, x.doc, x.d, x.b
    word = "OFFLOAD" if v["offload"] else "KEEP LOCAL"
    relation = ">" if v["offload"] else "<="
    if not v["decided"]:  # the interval holds the budget, or the resamples disagree
        word, relation = f"UNDECIDED (leaning {word.lower()})", "vs"
    fit = doc.get("fit", {})
    r2 = fit.get("held_out_r2")
    score = "not enough points for a held-out fit" if r2 is None else f"held-out R^2 {r2:.4f}, {fit.get('scheme', '?')}"
    out = Rendered([
        f"{word}: interference {v['cost_ms']:.1f} ms{_iv(v['intervals'].get('colocated_cost_ms'))} "
        f"{relation} transfer {v['transfer_ms']:.1f} ms (margin {v['margin_ms']:+.1f} ms)",
        f"  D={d} P={x.p} B={b}: {plural(v['chunks'], 'chunk')} of <= {chunk_rule_of(doc).budget(b, d)} tokens; "
        f"model {v['model']} ({score})"])
    return _footer(x, out, seed_note=bool(doc.get("two_arm")))


def _two_arm(x: Decided) -> Rendered:
    from pdexporter.analysis.decision_eval import DECIDED_SHARE, WEAK_R2, chunk_context

    v, doc, d, p, b = x.verdict, x.doc, x.d, x.p, x.b
    word = "UNDECIDED" if not v["decided"] else ("OFFLOAD" if v["offload"] else "KEEP LOCAL")
    ivs = v["intervals"]
    split = v["offloaded_ttft_split_ms"]
    arms = doc["two_arm"]
    transfer = arms["terms"].get("transfer") or {}
    if v["transfer_source"] == "measured" and transfer.get("gb_per_s"):
        how = (f"{p * transfer['bytes_per_token'] / 1e9:.2f} GB at {transfer['gb_per_s']:.0f} GB/s + "
               f"{transfer['latency_ms']:.1f} ms")
    else:
        how = v["transfer_source"]
    out = Rendered([
        f"{word}: {v['verdict'].split(': ', 1)[1]}" if v["decided"] else f"{word} {v['verdict'].split(' ', 1)[1]}",
        f"  decodes lose: colocated {v['colocated_cost_ms']:.1f} ms{_iv(ivs.get('colocated_cost_ms'))}, offloaded "
        f"{v['offloaded_cost_ms']:.1f} ms{_iv(ivs.get('offloaded_cost_ms'))}; saved {v['saved_ms']:+.1f} ms"
        f"{_iv(ivs.get('saved_ms'), signed=True)}",
        f"  TTFT: colocated {v['colocated_ttft_ms']:.1f} ms{_iv(ivs.get('colocated_ttft_ms'))}; offloaded "
        f"{v['offloaded_ttft_ms']:.1f} ms{_iv(ivs.get('offloaded_ttft_ms'))} = prefill alone {split['prefill']:.1f} "
        f"+ KV transfer {split['transfer']:.1f} ({how}) + decode side {split['decode_side']:.1f} ms; "
        f"cost {v['ttft_cost_ms']:+.1f} ms{_iv(ivs.get('ttft_cost_ms'), signed=True)}"])
    if v["colocated_tpot_ms"] is not None and v["offloaded_tpot_ms"] is not None and d > 0:
        out.out.append(f"  TPOT during the prefill: colocated {v['colocated_tpot_ms']:.1f} ms, offloaded "
                       f"{v['offloaded_tpot_ms']:.1f} ms")
    for name, held in v["slos"].items():
        out.out.append(f"  {name} SLO: colocated {'held' if held['colocated'] else 'missed'}, offloaded "
                       f"{'held' if held['offloaded'] else 'missed'}")
    # the chunks not run eagerly replay CUDA graphs
    graphs = v["chunks"] - (int(chunk_context(doc, d, p, b)["eager_chunks"]) if doc else 0)
    out.out.append(f"  D={d} P={p} B={b}: {plural(v['chunks'], 'chunk')} of <= {chunk_rule_of(doc).budget(b, d)} "
                   f"tokens{f', {graphs} run as CUDA graphs' if graphs else ''}; offloaded arm: "
                   f"{arms.get('offloaded_setup')}; rule: {v['reason']}")
    if v.get("agreement") is not None:
        n = len((doc.get("replicates") or {}).get("model") or [])
        out.out.append(f"  {v['agreement']:.0%} of {n} bootstrap resamples agree"
                       + ("" if v["decided"] else f" (a decided verdict needs {DECIDED_SHARE:.0%})"))
    if v.get("degraded_regime"):
        deg = v["degraded_regime"]
        same = deg["offload"] == v["offload"]
        out.notes.append(Plain(
            f"pdexporter: note: {deg['share_of_windows']:.0%} of the pair's KV transfers ran in a slow "
            f"regime ({deg['gb_per_s']:g} GB/s); there the verdict is "
            f"{'the same' if same else ('offload' if deg['offload'] else 'keep local')}"
            f"{'' if same else ' (--transfer-regime degraded)'}"))
    if v.get("weak_fits"):
        out.notes.append(Plain(f"pdexporter: warning: weak fit: {'; '.join(v['weak_fits'])} (held-out R^2 below "
                               f"{WEAK_R2:g}): the intervals say how little they pin down"))
    return _footer(x, out)


def _footer(x: Decided, out: Rendered, seed_note: bool = False) -> Rendered:
    """The lines both verdicts end with: the point as measured, the fitted range, what the model was fitted on."""
    from pdexporter.analysis.decision_eval import held_out_text

    doc, v = x.doc, x.verdict
    if x.measured is not None:
        seen = "modelled" if doc.get("modelled") else "measured"
        out.out.append(f"  {seen} at this point: {x.measured['aggregate_interference_ms']:.1f} ms aggregate "
                       f"({plural(x.measured['reps'], 'rep')})")
    if not v["in_fitted_range"]:
        # what `evaluate_decision` found outside the fitted ranges, and its widest widening
        out.notes.append(Plain(f"[yellow]pdexporter: warning: MODELLED beyond what was measured "
                               f"({'; '.join(v['extrapolated'])}); the intervals of the numbers resting on them "
                               f"widened (up to x{v['interval_widening']:.1f})[/]"))
    out.notes.append(Plain(held_out_text(doc)))
    if seed_note:
        out.notes.append("the seed's rule (--mode seed); the two-arm verdict is the default with both arms measured")
    if doc.get("modelled"):
        out.notes.append(MODELLED_NOTE)
    return out


# -- thresholds -----------------------------------------------------------------------------------

def thresholds_job(model: Path, *, tpot_slo_ms: float | None = None, ttft_slo_ms: float | None = None,
                   mode: str | None = None, regime: str = "nominal", out: Path | None = None,
                   decode_batch_size: int | None = None, chunk_size: int | None = None, p_max: int = 131072,
                   replicates: int = 100, transfer_ms: float | None = None) -> Thresholds:
    """`pdexporter thresholds`: the options checked against the decision document `model`."""
    from pdexporter._internal.writable import check_writable

    doc = load_decision(model)
    if out is not None:
        check_writable(out)
    _check_modes(mode, regime)
    two_arm = bool(doc.get("two_arm")) and mode != "seed"
    if mode == "two-arm" and not doc.get("two_arm"):
        raise ConfigError(f"--mode two-arm: {model} has one arm only (export-table RESULTS --offloaded DIR)")
    if (tpot_slo_ms is not None or ttft_slo_ms is not None) and not two_arm:
        raise ConfigError("--tpot-slo-ms/--ttft-slo-ms: SLOs need the two-arm verdict (both arms measured)")
    fitted = sorted({int(b) for b in ((doc.get("valid_range") or {}).get("chunk_sizes") or [])})
    if chunk_size is not None and fitted and not min(fitted) <= chunk_size <= max(fitted):
        raise ConfigError(f"--chunk-size {chunk_size}: {model} was fitted on B = {', '.join(map(str, fitted))}")
    return Thresholds(model, doc, out, decode_batch_size, chunk_size, p_max,
                      dict(tpot_slo_ms=tpot_slo_ms, ttft_slo_ms=ttft_slo_ms, mode=mode, p_max=p_max,
                           replicates=replicates, regime=regime, transfer_ms=transfer_ms,
                           chunk_sizes=[chunk_size] if chunk_size is not None else None))


@dataclass
class Thresholds:
    model: Path
    doc: dict[str, Any]
    out: Path | None
    decode_batch_size: int | None
    chunk_size: int | None
    p_max: int
    options: dict[str, Any]

    def run(self) -> Rendered:
        """Scan the prefill lengths; the table, the llm-d snippet (or, with `out`, the files written)."""
        from pdexporter._internal.atomic import atomic_write_json, atomic_write_text
        from pdexporter.analysis.thresholds import LLMD_SNIPPET, THRESHOLDS_JSON, compute_thresholds, llmd_snippet

        result = compute_thresholds(self.doc, **self.options)
        model = self.model
        if not result.records:
            raise ConfigError(f"{model}: no (B, D) with D >= 1 in its fitted range")
        measured = [b for b in result.chunk_sizes() if not any(t.modelled_b for t in result.by_chunk_size(b))]
        b = self.chunk_size if self.chunk_size is not None else max(measured or result.chunk_sizes())
        decodes = [t.decode_batch_size for t in result.by_chunk_size(b)]
        d = self.decode_batch_size if self.decode_batch_size is not None else max(decodes)
        if d not in decodes:
            raise ConfigError(f"--decode-batch-size {d}: {model} has thresholds for D = {', '.join(map(str, decodes))}")
        where_p = (f"; measured P {result.measured_p[0]}..{result.measured_p[1]}" if result.measured_p else "")
        shown = Rendered([f"{result.mode} verdict, {result.budget.text()}{where_p}"])
        for bb in result.chunk_sizes():
            entries = result.by_chunk_size(bb)
            where = "MODELLED: the offloaded arm was not measured here" if any(t.modelled_b for t in entries) \
                else "measured"
            shown.out.append(f"B={bb} ({where}):")
            shown.out += [f"  D={t.decode_batch_size}: {t.text(result.step, self.p_max, result.measured_p)}"
                          for t in entries]
        shown.notes += [Plain(f"pdexporter: warning: a threshold rises with D ({line}): look at the terms' fits")
                        for line in result.rising()]
        if self.doc.get("modelled"):
            shown.notes.append(MODELLED_NOTE)
        snippet = llmd_snippet(result, b, d)
        if self.out is None:
            shown.out += [f"\n# llm-d ({THRESHOLDS_JSON} and {LLMD_SNIPPET}: --out DIR)", snippet.removesuffix("\n")]
            return shown
        atomic_write_json(self.out / THRESHOLDS_JSON, result.to_dict())
        atomic_write_text(self.out / LLMD_SNIPPET, snippet)
        shown.out += [str(self.out / THRESHOLDS_JSON), str(self.out / LLMD_SNIPPET)]
        return shown
