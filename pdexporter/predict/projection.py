"""A projection's error on a model measured but not used to build it: leave one model out (issue 36).

Each measured model (`MEASURED`: its results directory, its config.json, its calibrated profile) is
projected from its config.json with the calibrated profiles of the *other* measured models as the
references (`pdexporter.sim.projection`), the protocol is run with that projection on the embedded
engine for every configuration the model was measured at (`RecordSimulator`, in the records' mode),
and the prediction is compared with the measurement per quantity (`compare_records`): MAPE and the
median signed error, for the rule before issue 36 ("carry": the first reference's efficiencies,
layer costs scaled by layers) and the learned one; and, as the yardstick, the model's own calibrated
profile over the same configurations ("own": not a projection, the best a projection could hope
for). Each score also holds the MAPE over the configurations whose prompt takes two or more chunks
(`multi_chunk`): a one-chunk prompt's penalty moves with the host's launch level, which takes the
launch into the decodes' interval before the chunk step or leaves it in that step's
(results/h200-vllm0.22-qwen2.5-32b-instruct/RUN.md), a state of the host, not of the model. A model
with no other calibrated model to learn from is reported as such, not scored.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from pdexporter.measure.records import RunRecord
from pdexporter.measure.store import ResultsStore
from pdexporter.predict.calibrate import METRICS, HoldoutReport, Key, RecordSimulator, compare_records, figures_of
from pdexporter.sim.modelconfig import load_config, profile_from_config
from pdexporter.sim.profile import PROFILES_DIR, Profile, load_profile
from pdexporter.sim.projection import calibrated

__all__ = ["MEASURED", "RULES", "MeasuredModel", "ProjectionScore", "leave_one_model_out", "multi_chunk", "project",
           "score", "signed"]

REPO = Path(__file__).resolve().parents[2]
RULES = ("carry", "learned", "own")  # "own": the target's own calibrated profile, the yardstick


@dataclass(frozen=True)
class MeasuredModel:
    name: str
    results: str  # results directory, relative to the repository
    config: str  # a shipped config.json's name (pdexporter/sim/configs) or a path
    profile: str  # its calibrated profile (shipped name): a reference for the other models
    gpu: str = "H200"
    dummy_weights: bool = True  # the GPU runs served --load-format dummy
    max_model_len: int | None = None

    def records(self, root: Path = REPO) -> list[RunRecord]:
        return list(ResultsStore(root / self.results).iter_records())

    def reference(self) -> Profile | None:
        """Its calibrated profile, if it has one yet."""
        path = PROFILES_DIR / f"{self.profile}.yaml"
        if not path.is_file():
            return None
        prof = load_profile(path)
        return prof if calibrated(prof) else None


MEASURED = (
    MeasuredModel("qwen3-coder-30b-a3b", "results/h200-vllm0.22-qwen3-coder-30b-a3b", "qwen3-coder-30b-a3b",
                  "h200-qwen3-coder-30b-a3b", max_model_len=200_000),
    MeasuredModel("llama-3.1-8b-instruct", "results/h200-vllm0.22-llama-3.1-8b-instruct", "llama-3.1-8b-instruct",
                  "h200-llama-3.1-8b-instruct", max_model_len=65_536),
    MeasuredModel("qwen2.5-32b-instruct", "results/h200-vllm0.22-qwen2.5-32b-instruct", "qwen2.5-32b-instruct",
                  "h200-qwen2.5-32b-instruct", max_model_len=32_768),
    MeasuredModel("qwen3-14b", "results/h200-vllm0.22-qwen3-14b", "qwen3-14b", "h200-qwen3-14b",
                  max_model_len=40_960),
)


def project(model: MeasuredModel, references: Sequence[Profile], rule: str = "learned") -> Profile:
    """`model` projected from its config.json and `references` (`profile_from_config`)."""
    cfg, source = load_config(model.config)
    return profile_from_config(cfg, model.gpu, model_name=model.name, source=source, carry_from=list(references),
                               max_model_len=model.max_model_len, dummy_weights=model.dummy_weights, rule=rule)


def score(profiles: Sequence[Profile], records: Sequence[RunRecord], *, jobs: int = 1) -> list[HoldoutReport]:
    """Each profile's prediction of the records' configurations against the measurement."""
    from pdexporter.measure.protocol import ProtocolSettings

    measured = figures_of(records)
    c = records[0].config
    settings = ProtocolSettings(decode_context_tokens=c.decode_context_tokens,
                                decode_output_tokens=c.decode_output_tokens, prefill_max_tokens=c.prefill_max_tokens)
    mode = "fast" if {r.config.mode for r in records} == {"fast"} else "faithful"
    with RecordSimulator(list(measured), settings, mode=mode, jobs=jobs) as simulate:
        predicted = simulate(list(profiles), list(measured))
    return [compare_records(measured, p) for p in predicted]


def multi_chunk(key: Key) -> bool:
    """The prompt takes two or more chunks (P + D > B: the first chunk shares the budget with the D decodes)."""
    chunk, d, p = key
    return p + d > chunk


def signed(report: HoldoutReport, metric: str) -> tuple[float | None, float | None, float | None]:
    """(median, lowest, highest) signed relative error, in %."""
    rel = [e.rel * 100 for e in report.of(metric) if not math.isnan(e.rel)]
    if not rel:
        return None, None, None
    return statistics.median(rel), min(rel), max(rel)


@dataclass(frozen=True)
class ProjectionScore:
    target: str
    rule: str
    references: tuple[str, ...]
    n: int  # configurations compared
    mape: dict[str, float | None]
    median_signed: dict[str, float | None]
    range_signed: dict[str, tuple[float | None, float | None]]
    note: str = ""
    multi_chunk: dict[str, float | None] = field(default_factory=dict)  # MAPE over P + D > B only


def leave_one_model_out(models: Sequence[MeasuredModel] = MEASURED, *, rules: Sequence[str] = RULES,
                        keys: Collection[Key] | None = None, jobs: int = 1, root: Path = REPO
                        ) -> list[ProjectionScore]:
    """Every measured model with records (among `keys`), projected from the other models' calibrated profiles
    with each rule of `rules` ("own": its own calibrated profile instead, if it has one) and scored."""
    out: list[ProjectionScore] = []
    for target in models:
        records = target.records(root)
        if keys is not None:
            records = [r for r in records if r.key in keys]
        if not records:
            continue
        refs = [r for m in models if m is not target and (r := m.reference()) is not None]
        if not refs:
            out.append(ProjectionScore(target.name, "-", (), 0, {}, {}, {},
                                       "no other measured model has a calibrated profile: nothing to learn from"))
            continue
        own = target.reference()
        chosen: list[tuple[str, Profile, tuple[str, ...]]] = []
        for rule in rules:
            if rule != "own":
                chosen.append((rule, project(target, refs, rule), tuple(p.name for p in refs)))
            elif own is not None:
                chosen.append((rule, own, (own.name,)))
        for (rule, _, names), report in zip(chosen, score([p for _, p, _ in chosen], records, jobs=jobs)):
            n = len({e.key for m in METRICS for e in report.of(m)})
            stats = {m: signed(report, m) for m in METRICS}
            out.append(ProjectionScore(
                target.name, rule, names, n, {m: report.metric_mape(m) for m in METRICS},
                {m: s[0] for m, s in stats.items()}, {m: (s[1], s[2]) for m, s in stats.items()},
                multi_chunk={m: report.metric_mape(m, multi_chunk) for m in METRICS}))
    return out
