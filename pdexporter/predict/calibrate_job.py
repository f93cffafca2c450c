"""`pdexporter sim calibrate` as one job: read the records, fit the base profile to them
(`predict.calibrate.calibrate`), predict the held-out configurations and other campaigns, and
report it all (tables as `Sheet`s, lines), writing the fitted profile and the JSON report.

`calibrate_job(request, progress)` does the work; the `CalibrationRun` it returns yields what is
shown, in order, writes the files, and ends by refusing a fit worse than its base."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from pdexporter._internal.atomic import atomic_write_json, atomic_write_text
from pdexporter._internal.sheet import Column, Sheet, Shown, columns, pct
from pdexporter._internal.writable import check_writable
from pdexporter.errors import ConfigError, RecordError
from pdexporter.predict.calibrate import (
    BOUNDS,
    DEFAULT_FREE,
    GPU_PARAMS,
    HEADLINE,
    METRIC_LABELS,
    METRICS,
    RESOLVED,
    Calibration,
    Generalisation,
    HoldoutReport,
    Progress,
    RecordSimulator,
    calibrate,
    compare_records,
    decode_table,
    figures_of,
    forced_warning,
    free_for,
    held_out_check,
    host_states,
    profile_to_write,
    refusal,
    worse_of,
)
from pdexporter.predict.calibrate import generalisation as leave_one_out

if TYPE_CHECKING:
    from pdexporter.measure.protocol import ProtocolSettings
    from pdexporter.measure.records import RunRecord
    from pdexporter.sim.profile import Profile


__all__ = [
    "CalibrationProgress", "CalibrationRequest", "CalibrationRun", "Extra", "calibrate_job", "calibration_sheets",
    "campaign_words", "decode_sheet", "extra_sheet", "generalisation_sheet",
]


class CalibrationProgress(Progress, Protocol):
    """Where the job reports: calibration's stages, the engine-loop fit's sweeps, and notes."""

    def info(self, text: str) -> None: ...

    def note(self, text: str) -> None: ...


@dataclass(frozen=True)
class CalibrationRequest:
    """The command's options (`sim calibrate --help` says what each means)."""

    results_dir: Path
    profile: str
    out: Path | None = None
    holdout: float = 0.2
    train_grid: Path | None = None
    train_reps: int | None = None
    also_predict: list[Path] = field(default_factory=list)
    tolerance: float = 1.0
    free: str | None = None
    rounds: int = 2
    max_evaluations: int = 24
    jobs: int = 0
    generalisation: bool = False
    accept_worse: bool = False
    report: Path | None = None

    def free_names(self) -> list[str]:
        names = [f.strip() for f in self.free.split(",") if f.strip()] if self.free else list(DEFAULT_FREE)
        unknown = [n for n in names if n not in BOUNDS]
        if unknown:
            raise ConfigError(f"--free {','.join(unknown)}: unknown parameter; fittable: {', '.join(sorted(BOUNDS))}")
        return names


@dataclass
class Extra:
    """Another campaign predicted with both profiles (--also-predict)."""

    directory: Path
    base: HoldoutReport
    fitted: HoldoutReport
    slow: set


@dataclass
class CalibrationRun:
    request: CalibrationRequest
    base: Profile
    records: list[RunRecord]
    names: list[str]
    mode: str
    workers: int
    result: Calibration
    loo: Generalisation | None
    extra: list[Extra]
    simulated: int
    simulation_cpu_s: float
    started: float

    def outcome(self) -> Iterator[Shown]:
        """What the command shows, in order; writes the profile and the report on the way, and
        raises `FitWorseThanBase` at the end when the fit is worse than its base (unless accepted)."""
        r, result, base = self.request, self.result, self.base
        yield from calibration_sheets(base, result, self.names, self.mode)
        for e in self.extra:
            yield extra_sheet(e, r.results_dir)
        decode_rows = decode_table({"base": base, "fitted": result.profile}, self.records)
        yield decode_sheet(decode_rows)
        if self.loo is not None:
            yield generalisation_sheet(self.loo)
        timings = {**result.timings, **({"generalisation": self.loo.seconds} if self.loo is not None else {}),
                   "wall": time.perf_counter() - self.started}
        yield (f"wall {timings['wall']:.1f} s ({self.workers} worker process(es), {self.simulated} (B, D) groups "
               f"simulated, {self.simulation_cpu_s:.0f} s of simulation CPU): "
               + ", ".join(f"{k} {v:.1f} s" for k, v in timings.items() if k not in ("wall", "total", "split")))
        check = held_out_check(result, r.tolerance)  # the fit against its base, per quantity of the held-out table
        worse = worse_of(check)
        payload = self.payload(decode_rows, timings, worse)
        payload["calibration_check"] = check.model_dump(mode="json")
        written = None
        if r.out is not None and (not worse or r.accept_worse):
            fitted = profile_to_write(result.profile, check, force=r.accept_worse)
            # the base's campaign variation, borrowed (`sim.profile.CampaignVariation`): this fit was not
            # measured across campaigns
            lent = fitted.campaign_variation.lent_by(fitted.name) if fitted.campaign_variation else None
            named = fitted.model_copy(update={"name": r.out.stem, "campaign_variation": lent})
            atomic_write_text(r.out, named.to_yaml())
            written = str(r.out)
            yield f"fitted profile written: {r.out} (calibration: {named.calibration})"
            if worse:
                yield f"[bold yellow]{forced_warning(check)}[/]"
        payload["written"] = written
        if r.report is not None:
            atomic_write_json(r.report, payload)
            yield f"report written: {r.report}"
        if not result.held_keys:
            yield ("no configuration held out (--holdout 0): the errors above are in-sample and the fit was not "
                   "checked against the base profile")
        yield f"calibrated in {timings['wall']:.0f} s" + (f" -> {r.out}" if written else "")
        if worse and not r.accept_worse:
            raise refusal(check, out=r.out)

    def payload(self, decode_rows: list[dict[str, object]], timings: dict[str, float],
                worse: list[tuple[str, float, float]]) -> dict[str, Any]:
        """The --report JSON (without `written`)."""
        r, result, base = self.request, self.result, self.base
        payload: dict[str, Any] = {
            "results_dir": str(r.results_dir), "base_profile": base.name, "holdout": r.holdout, "mode": self.mode,
            "train_grid": str(r.train_grid) if r.train_grid is not None else None, "train_reps": r.train_reps,
            "tolerance": r.tolerance, "host": result.profile.host.model_dump(),
            "slow_host_train": sorted(map(list, result.slow_keys)),
            "slow_host_held_out": sorted(map(list, result.held_slow)),
            "free": self.names, "rounds": result.rounds, "max_evaluations": r.max_evaluations, "jobs": self.workers,
            "parameters": _parameters(result.profile), "base_parameters": _parameters(base),
            "train_configurations": sorted(map(list, result.train_keys)),
            "held_out_configurations": sorted(map(list, result.held_keys)),
            "stage1": {
                "n": result.fit.n, "mape": result.fit.mape, "by_kind": result.fit.by_kind,
                "base_mape": result.before[0], "base_by_kind": result.before[3],
                "held_out_mape": result.held_step_mape, "held_out_base_mape": result.held_step_mape_before,
            },
            "stage2": None if result.loop is None else {"rms_log": result.loop.rms_log,
                                                        "evaluations": result.simulations},
            "decode_steps": decode_rows, "timings_s": timings, "simulated_groups": self.simulated,
            "simulation_cpu_s": self.simulation_cpu_s,
            "worse_than_base": [{"metric": m, "fitted": f, "base": b} for m, f, b in worse],
            "piecewise_floor": None if result.floor is None else {
                "ms": result.floor.ms, "groups": [g._asdict() for g in result.floor.groups]},
        }
        for label, held in (("base", result.held_base), ("fitted", result.held_fitted),
                            ("fitted_host_matched", result.held_fitted_host)):
            if held is not None:
                mapes = held.table()
                payload[f"held_out_{label}"] = {
                    "mape": mapes, "by_kind": held.by_kind(), "resolved": held.resolved(),
                    "points": {m: [{"key": list(e.key), "measured": e.measured, "predicted": e.predicted}
                                   for e in held.of(m)] for m in mapes},
                }
        if result.held_fitted is not None:
            payload["held_out_fitted"]["mape_nominal_host"] = {m: result.nominal_mape(m) for m in METRICS}
        payload["also_predicted"] = [
            {"results_dir": str(e.directory), "base": e.base.table(), "fitted": e.fitted.table(),
             "slow_host": sorted(map(list, e.slow)),
             "fitted_nominal_host": {m: e.fitted.metric_mape(m, where=_outside(e.slow)) for m in METRICS}}
            for e in self.extra]
        if self.loo is not None:
            payload["generalisation"] = {"groups": self.loo.table(), "simulated_groups": self.loo.simulations,
                                         "seconds": self.loo.seconds}
        return payload


def _parameters(profile: Profile) -> dict[str, Any]:
    return {f"{section}.{name}": value for section in ("step_time", "engine_loop", "host")
            for name, value in getattr(profile, section).model_dump().items()}


def _records(request: CalibrationRequest) -> tuple[list[RunRecord], set | None, list[tuple[Path, list[RunRecord]]]]:
    """The records to fit (cut to --train-reps), the --train-grid's keys, the --also-predict ones."""
    from pdexporter.measure.records import aggregate
    from pdexporter.measure.store import ResultsStore

    results_dir = request.results_dir
    records = list(ResultsStore(results_dir).iter_records())
    if not records:
        raise RecordError(f"{results_dir}: no records (expected {{chunk}}/D{{d}}_P{{p}}.json)")
    train_keys = None
    if request.train_grid is not None:
        from pdexporter.sweep.spec import load_sweep

        wanted = set(load_sweep(request.train_grid).points())
        train_keys = {r.key for r in records if r.key in wanted}
        if not train_keys:
            raise ConfigError(f"--train-grid {request.train_grid}: none of its configurations is among the records "
                              f"of {results_dir}")
    if request.train_reps is not None:
        n = request.train_reps
        fitted_keys = train_keys if train_keys is not None else {r.key for r in records}
        records = [aggregate(r.config, r.reps[:n]) if r.key in fitted_keys and len(r.reps) > n else r
                   for r in records]
    extra: list[tuple[Path, list[RunRecord]]] = []
    for directory in request.also_predict:
        if not directory.is_dir():
            raise ConfigError(f"--also-predict {directory}: not a directory")
        others = list(ResultsStore(directory).iter_records())
        if not others:
            raise RecordError(f"--also-predict {directory}: no records")
        extra.append((directory, others))
    return records, train_keys, extra


def calibrate_job(request: CalibrationRequest, progress: CalibrationProgress) -> CalibrationRun:
    """Check the request, read the records, fit, and predict what was asked; `progress` sees it."""
    from pdexporter.sim.profile import load_profile

    started = time.perf_counter()
    names = request.free_names()
    if not request.results_dir.is_dir():
        raise ConfigError(f"RESULTS_DIR {request.results_dir}: not a directory")
    for flag, path in (("--out", request.out), ("--report", request.report)):
        if path is not None:
            check_writable(path, flag, directory=False)
    base = load_profile(request.profile)
    names = list(free_for(base, names))  # a dense model: its GEMM efficiency in place of the experts'
    records, train_keys, others = _records(request)
    modelled = sum(1 for r in records if r.config.modelled)
    if modelled:
        progress.note(f"[yellow]{modelled} of {len(records)} records are MODELLED (embedded engine): fitting a model "
                      "to a model's output only checks the fitting.[/]")
    gpus = sorted({r.config.gpu for r in records})
    if gpus != [base.gpu.name]:
        progress.note(f"[yellow]records are from GPU {', '.join(gpus)}; the base profile is for {base.gpu.name}[/]")
    mode = "fast" if sorted({r.config.mode for r in records}) == ["fast"] else "faithful"
    workers = request.jobs or min(8, len(os.sched_getaffinity(0)))
    simulator = RecordSimulator([r.key for r in records], _settings_of(records[0]), mode=mode, jobs=workers,
                                on_group=lambda g: progress.advance(1))
    try:
        with simulator:
            result = calibrate(base, records, holdout=request.holdout, train_keys=train_keys, free=names,
                               source=str(request.results_dir), simulate=simulator, rounds=request.rounds,
                               max_evaluations=request.max_evaluations, progress=progress,
                               on_evaluation=lambda r, i, rms: progress.info(f"sweep {i}: rms log {rms:.3f}"))
            loo = (leave_one_out(result, records, simulator, free=names, progress=progress)
                   if request.generalisation else None)
        extra = [_predict_other(directory, recs, base, result.profile, mode, workers, progress)
                 for directory, recs in others]
    except ValueError as exc:
        raise ConfigError(f"calibrate {request.results_dir}: {exc}") from exc
    progress.stage("done")
    return CalibrationRun(request, base, records, names, mode, workers, result, loo, extra, simulator.simulated,
                          simulator.cpu_s, started)


def _predict_other(directory: Path, others: list[RunRecord], base: Profile, fitted: Profile, mode: str, workers: int,
                   progress: CalibrationProgress) -> Extra:
    progress.stage(f"predicting {directory}")
    with RecordSimulator([r.key for r in others], _settings_of(others[0]), mode=mode, jobs=workers) as other:
        measured = figures_of(others)
        base_pred, fitted_pred = other([base, fitted], list(measured))
        slow, _, _, _ = host_states(fitted, measured, other)
    return Extra(directory, compare_records(measured, base_pred), compare_records(measured, fitted_pred), slow)


def _settings_of(record: RunRecord) -> ProtocolSettings:
    from pdexporter.measure.protocol import ProtocolSettings

    c = record.config
    return ProtocolSettings(decode_context_tokens=c.decode_context_tokens, decode_output_tokens=c.decode_output_tokens,
                            prefill_max_tokens=c.prefill_max_tokens)


def _outside(keys: set) -> Callable[[tuple[int, int, int]], bool]:
    return lambda key: key not in keys


# -- what is shown --------------------------------------------------------------------------------

def calibration_sheets(base: Profile, result: Calibration, names: list[str], mode: str) -> Iterator[Shown]:
    """The parameters, the stage-1 fit, the training data, stage 2, the held-out errors, the host."""
    params = Sheet(f"{base.name}: parameters (* fitted)", columns("parameter", "base", "fitted", justify="right",
                                                                  first="left"))
    for section in ("step_time", "engine_loop", "host"):
        old = getattr(base, section).model_dump()
        new = getattr(result.profile, section).model_dump()
        for name in new:
            # a GPU parameter stage 1 dropped (piecewise_gpu_ms where no training step ran a piecewise graph) stays
            mark = " *" if name in names and (name not in GPU_PARAMS or name in result.fit.free) else ""
            params.add_row(f"{section}.{name}{mark}", f"{old[name]}",
                           f"{new[name]:.4g}" if isinstance(new[name], float) else f"{new[name]}")
    yield params
    fit = Sheet("stage 1: step times of the training configurations (decode steps, middle chunks)",
                [Column("profile"), Column("n", "right"), Column("MAPE", "right"), Column("worst", "right"),
                 Column("by kind")])
    b_mape, _, b_max, b_kinds = result.before
    r = result.fit
    fit.add_row("base", str(r.n), f"{b_mape:.1f} %", f"{b_max:.1f} %",
                ", ".join(f"{k} {v:.1f} %" for k, v in b_kinds.items()))
    fit.add_row("fitted", str(r.n), f"{r.mape:.1f} %", f"{r.max_ape:.1f} %",
                ", ".join(f"{k} {v:.1f} %" for k, v in r.by_kind.items()))
    yield fit
    train = result.train
    yield (f"training: {len(result.train_keys)} configurations, {train.reps_used} reps with every "
           f"chunk seen, {train.reps_mismatched} reps whose chunk steps did not match their chunks "
           "(decode step only)")
    if result.floor is not None:
        yield result.floor.describe()
    loop = result.loop
    if loop is not None:
        yield (f"stage 2 (engine loop, by simulation in {mode} mode): {loop.n_configs} configurations, "
               f"{loop.n_residuals} residuals, rms log error {loop.rms_log:.3f} after "
               f"{result.simulations} simulated sweeps ({loop.message})")
    for label, held in (("base", result.held_base), ("fitted", result.held_fitted)):
        if held is not None:
            yield from _held_out_sheets(label, held, result, mode)
    if result.sensitive_keys or result.held_slow:
        h = result.profile.host
        yield (f"host: {len(result.slow_keys)} of the {len(result.sensitive_keys)} training configurations the "
               f"host's speed moves ran in a slow-host episode (CPU x {h.slow_factor:.2f}: slow_fraction "
               f"{h.slow_fraction:.2f}); held out: {len(result.held_slow)} of {len(result.held_keys)}. The "
               "prediction is the nominal host's; 'host-matched' predicts each configuration on the host it "
               "ran on (MODELLED distribution, docs/sim.md)")


def _held_out_sheets(label: str, held: HoldoutReport, result: Calibration, mode: str) -> Iterator[Sheet]:
    mapes = held.table()
    chunks = [k for k in mapes["prefill_duration"] if k != "all"]
    host = label == "fitted" and bool(result.sensitive_keys or result.held_slow)
    heads = [*(f"B={c}" for c in chunks), "all"]
    if host:
        heads += [f"nominal host ({len(result.held_keys - result.held_slow)})", "host-matched"]
    table = Sheet(f"{label} profile: MAPE on the {len(result.held_keys)} held-out configurations of the "
                  "SAME campaign as the fit (another campaign's error: --also-predict DIR) (predicted by "
                  f"running the protocol on the embedded engine, {mode} mode, nominal host)",
                  columns("metric", *heads, justify="right", first="left"))
    for metric in METRICS:
        cells = [pct(mapes[metric].get(c)) for c in chunks] + [pct(mapes[metric]["all"])]
        if host:
            matched = result.held_fitted_host.metric_mape(metric) if result.held_fitted_host else None
            cells += [pct(result.nominal_mape(metric)), pct(matched)]
        table.add_row(METRIC_LABELS[metric], *cells)
    yield table
    kinds = Sheet(f"{label} profile: held-out MAPE by kind of configuration",
                  columns("configurations", "n", *(METRIC_LABELS[m] for m in HEADLINE), justify="right",
                          first="left"))
    for kind, row in held.by_kind().items():
        kinds.add_row(kind, str(row["n"]), *[pct(row[m]) for m in HEADLINE])
    row = held.resolved()
    kinds.add_row(f"(all) {RESOLVED}", str(row["n"]), *[pct(row[m]) for m in HEADLINE])
    yield kinds


def campaign_words(directory: Path, fitted_on: Path | None = None) -> str:
    """Which GPU campaign a results directory is (its campaign.yaml), and whether it is the one the
    fit read: an error on the same campaign is not a held-out-campaign error (docs/analysis.md)."""
    from pdexporter.analysis.campaigns import load_campaign

    info = load_campaign(directory)
    if info is None:
        return "campaign unnamed (no campaign.yaml)"
    if fitted_on is None:
        return f"campaign {info['id']}"
    fit = load_campaign(fitted_on)
    same = fit is not None and fit["id"] == info["id"]
    return f"campaign {info['id']}: {'the SAME campaign as the fit' if same else 'a campaign the fit never read'}"


def extra_sheet(extra: Extra, fitted_on: Path) -> Sheet:
    n = len({e.key for m in METRICS for e in extra.fitted.of(m)})
    table = Sheet(f"{extra.directory} ({campaign_words(extra.directory, fitted_on)}): MAPE on its {n} configurations "
                  "(none in the fit; nominal host)",
                  columns("metric", "base", "fitted", f"fitted, nominal host ({n - len(extra.slow)})",
                          justify="right", first="left"))
    for metric in METRICS:
        table.add_row(METRIC_LABELS[metric], pct(extra.base.metric_mape(metric)), pct(extra.fitted.metric_mape(metric)),
                      pct(extra.fitted.metric_mape(metric, where=_outside(extra.slow))))
    return table


def decode_sheet(rows: list[dict[str, Any]]) -> Sheet:
    table = Sheet("decode steps on and between the grid's D (MODELLED: steady-state step at the baseline "
                  "context; measured: median baseline TPOT over chunk sizes)",
                  columns("D", "graph", "base ms", "fitted ms", "measured ms", "same graph: D / measured ms",
                          "known ms", justify="right"))
    for r in rows:
        same = f"{r['same_graph_D']} / {r['same_graph_measured_ms']:.2f}" if r["same_graph_D"] is not None else "-"
        table.add_row(str(r["D"]), str(r["padded"]), f"{r['base_ms']:.2f}", f"{r['fitted_ms']:.2f}",
                      f"{r['measured_ms']:.2f}" if r["measured_ms"] is not None else "-", same,
                      f"{r['known_ms']:.1f}" if r["known_ms"] is not None else "-")
    return table


def generalisation_sheet(loo: Generalisation) -> Sheet:
    table = Sheet("generalisation: MAPE on the group left out, refitted without it (base profile in brackets)",
                  columns("left out", "n", *(METRIC_LABELS[m] for m in HEADLINE), justify="right", first="left"))
    for g in loo.groups:
        table.add_row(f"{g.by}={g.value}", str(g.n_configs),
                      *[f"{pct(g.fitted[m])} ({pct(g.base[m])})" for m in HEADLINE])
    return table
