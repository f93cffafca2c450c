"""The dense model's projection, predicted before the GPU run and compared after it.

    python scripts/gpu/dense_report.py predict   # before: predictions.json from the projected profile
    python scripts/gpu/dense_report.py compare   # after: comparison.csv / .md, MAPE per quantity
    python scripts/gpu/dense_report.py --model qwen2.5-32b-instruct predict --rule learned \
        --from h200-qwen3-coder-30b-a3b,h200-llama-3.1-8b-instruct   # the third model (issue 36)
    python scripts/gpu/dense_report.py --model qwen3-14b predict --rule learned \
        --from h200-qwen3-coder-30b-a3b,h200-llama-3.1-8b-instruct,h200-qwen2.5-32b-instruct   # the fourth

The projected profile `h200-llama-3.1-8b-instruct` (`calibration: projected`, written by
`pdexporter sim profile-from-config llama-3.1-8b-instruct --gpu H200`) runs the sweep protocol on the
embedded engine in virtual time (`predict.grid.predict_records`, fast mode as the GPU run) for every
configuration of sweeps/h200-dense-llama-3.1-8b.yaml. `compare` reads the GPU run's records
(results/h200-vllm0.22-llama-3.1-8b-instruct, unpacked from dense.tgz) and writes the error of the
projection per quantity: the baseline TPOT, the TPOT penalty (token-weighted p50 and mean of the
chunk steps), the prefill duration and the aggregate interference. Calibrating on the short grid and
predicting the rest is then one command (docs/sim.md, "Calibrating a new model").

`--model` picks another dense run from `MODELS`: its sweep file, whose `model` names the config.json
and the profile (h200-<model>), whose `output` is the results directory and whose launcher's
`--max-model-len` is the projection's; and the grid a calibration was fitted on, if any (compare
scores the rest as held out; none: the whole grid is). Qwen2.5-32B-Instruct (sweeps/h200-dense-qwen2.5-32b.yaml)
was fitted on by nothing: its projection from both calibrated references is the check of issue 36.
"""

from __future__ import annotations

import functools
import json
import re
import sys
from pathlib import Path
from typing import NamedTuple

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from pdexporter.engines.vllm import compilation_config_of
from pdexporter.errors import RecordError
from pdexporter.launch.local import render_command
from pdexporter.predict.calibrate import METRIC_FIELDS, PointFigures
from pdexporter.predict.grid import predict_records
from pdexporter.predict.projection_check import QUANTITIES, compare_projection
from pdexporter.sim.modelconfig import load_config, profile_from_config
from pdexporter.sim.profile import Profile, load_profile
from pdexporter.sweep.spec import SweepSpec, load_sweep


class DenseRun:
    """A dense model's GPU run: its sweep file and the grid a calibration was fitted on (None: none was).
    (A plain class: the tests load this script without registering it, which a dataclass needs.)"""

    def __init__(self, sweep: Path, fitted: Path | None = None) -> None:
        self.sweep, self.fitted = sweep, fitted

    @functools.cached_property
    def spec(self) -> SweepSpec:  # read once: model, profile, results and max_model_len all derive from it
        return load_sweep(self.sweep)

    @property
    def model(self) -> str:
        return str(self.spec.model)

    @property
    def profile(self) -> str:
        return f"h200-{self.model}"

    @property
    def results(self) -> Path:
        return ROOT / self.spec.output

    @property
    def max_model_len(self) -> int:
        found = re.search(r"--max-model-len[= ](\d+)", getattr(self.spec.launcher, "command", None) or "")
        if not found:
            raise SystemExit(f"{self.sweep}: the launcher command sets no --max-model-len")
        return int(found.group(1))

    @property
    def capture_sizes(self) -> tuple[int, ...] | None:
        """The launcher's `--compilation-config` capture sizes, where it gives them (None: vLLM's default list)."""
        launcher = self.spec.launcher
        command = getattr(launcher, "command", None)  # a local launcher's; the others start no command line
        if not isinstance(command, str) or not command:
            return None
        argv = render_command(command, 8192, getattr(launcher, "vars", None)).argv  # as the launcher fills it
        config = compilation_config_of(argv)
        sizes = (config or {}).get("cudagraph_capture_sizes")
        return None if sizes is None else tuple(int(s) for s in sizes)

    def fitted_grid(self) -> set[tuple[int, int, int]]:
        return set(load_sweep(self.fitted).points()) if self.fitted else set()


MODELS = {
    "llama-3.1-8b-instruct": DenseRun(ROOT / "sweeps" / "h200-dense-llama-3.1-8b.yaml",
                                      ROOT / "sweeps" / "calibrate-short.yaml"),
    "qwen2.5-32b-instruct": DenseRun(ROOT / "sweeps" / "h200-dense-qwen2.5-32b.yaml"),
    "qwen3-14b": DenseRun(ROOT / "sweeps" / "h200-dense-qwen3-14b.yaml"),
    # the fifth, never measured (session 31's H100 plan), on default flags and on the graphs grid's capture sizes
    "qwen3-8b": DenseRun(ROOT / "sweeps" / "h200-dense-qwen3-8b.yaml"),
    "qwen3-8b-graphs": DenseRun(ROOT / "sweeps" / "h200-dense-qwen3-8b-graphs.yaml"),
    # the sixth (session 32's H100 plan, results/h100-vllm0.22-qwen2.5-7b-instruct/PLAN.md), both flag sets
    "qwen2.5-7b-instruct": DenseRun(ROOT / "sweeps" / "h200-dense-qwen2.5-7b.yaml"),
    "qwen2.5-7b-instruct-graphs": DenseRun(ROOT / "sweeps" / "h200-dense-qwen2.5-7b-graphs.yaml"),
    # the seventh (session 33's H100 plan, results/h100-vllm0.22-llama-3.2-3b-instruct/PLAN.md), both flag sets
    "llama-3.2-3b-instruct": DenseRun(ROOT / "sweeps" / "h200-dense-llama-3.2-3b.yaml"),
    "llama-3.2-3b-instruct-graphs": DenseRun(ROOT / "sweeps" / "h200-dense-llama-3.2-3b-graphs.yaml"),
    # the eighth (session 41's H100 plan, results/h100-vllm0.22-qwen3-4b/PLAN.md), both flag sets
    "qwen3-4b": DenseRun(ROOT / "sweeps" / "h200-dense-qwen3-4b.yaml"),
    "qwen3-4b-graphs": DenseRun(ROOT / "sweeps" / "h200-dense-qwen3-4b-graphs.yaml"),
    # the ninth (session 42's H100 plan, results/h100-vllm0.22-llama-3.2-1b-instruct/PLAN.md), both flag sets
    "llama-3.2-1b-instruct": DenseRun(ROOT / "sweeps" / "h200-dense-llama-3.2-1b.yaml"),
    "llama-3.2-1b-instruct-graphs": DenseRun(ROOT / "sweeps" / "h200-dense-llama-3.2-1b-graphs.yaml"),
}
DEFAULT = "llama-3.1-8b-instruct"
SWEEP = MODELS[DEFAULT].sweep
OUT = MODELS[DEFAULT].results


class Variant(NamedTuple):
    """What a projection stated before a run sets of the projected profile, each where given (None: as projected):
    `piecewise_gpu_ms`, a piecewise-graph step's GPU wait, which no reference profile carries (e.g. Qwen3-8B's
    calibrated wait scaled by layers); `launch_eager_scale`, the eager launch times this (another host's launch level,
    e.g. an earlier campaign's on that GPU); `launch_piecewise_per_layer_ms`, the piecewise launch, ms a layer (a
    host's piecewise launch floor, which the H200 references hide under their steps:
    results/h100-vllm0.22-qwen3-4b/RUN.md)."""

    piecewise_gpu_ms: float | None = None
    launch_eager_scale: float | None = None
    launch_piecewise_per_layer_ms: float | None = None

    def applied(self, profile: Profile) -> Profile:
        update: dict[str, float] = {}
        if self.piecewise_gpu_ms is not None:
            update["piecewise_gpu_ms"] = self.piecewise_gpu_ms
        if self.launch_eager_scale is not None:
            update["launch_eager_ms"] = profile.step_time.launch_eager_ms * self.launch_eager_scale
        if self.launch_piecewise_per_layer_ms is not None:
            update["launch_piecewise_ms"] = self.launch_piecewise_per_layer_ms * profile.model.num_layers
        if not update:
            return profile
        return profile.model_copy(update={"step_time": profile.step_time.model_copy(update=update)})

    def words(self) -> str:
        """What it sets, as the predictions' profile line says it (empty: nothing)."""
        return (("" if self.piecewise_gpu_ms is None else f", piecewise GPU wait {self.piecewise_gpu_ms:g} ms")
                + ("" if self.launch_eager_scale is None else f", eager launch x {self.launch_eager_scale:g}")
                + ("" if self.launch_piecewise_per_layer_ms is None
                   else f", piecewise launch {self.launch_piecewise_per_layer_ms:g} ms a layer"))


AS_PROJECTED = Variant()


def projected_profile(run: DenseRun, rule: str | None, references: str, gpu: str,
                      max_model_len: int | None = None, variant: Variant = AS_PROJECTED) -> Profile:
    """The profile a prediction runs: the shipped one (no `rule`), or the model projected from its config.json and
    the `references` with that rule on `gpu`'s datasheet; with the sweep's CUDA-graph capture sizes, and what
    `variant` sets."""
    if rule is None:
        if gpu != "H200":
            raise SystemExit("predict: another GPU or sweep needs --rule (the shipped profiles are the H200's)")
        profile = load_profile(run.profile)
    else:
        cfg, source = load_config(run.model)
        # every GPU run here serves dummy weights: a MoE keeps the calibrated profile's routing of them
        profile = profile_from_config(cfg, gpu, name=f"{gpu.lower()}-{run.model}", model_name=run.model,
                                      source=source, carry_from=references.split(","), rule=rule,
                                      max_model_len=max_model_len or run.max_model_len, dummy_weights=True)
    sizes = run.capture_sizes
    if sizes is not None:  # the sweep's engine captures other sizes than vLLM's default list: the profile's too
        profile = profile.model_copy(update={"engine": profile.engine.model_copy(
            update={"cudagraph_capture_sizes": sizes, "max_cudagraph_capture_size": None})})
    return variant.applied(profile)


def write_profile(rule: str, references: str, gpu: str, target: Path, model: str = DEFAULT) -> None:
    """The projected profile of `predict --rule` as a file, the base `sim calibrate` starts from."""
    profile = projected_profile(MODELS[model], rule, references, gpu)
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(profile.to_yaml())
    print(f"wrote {target} ({profile.name}, {profile.calibration})")


def predict(rule: str | None = None, references: str = "h200-qwen3-coder-30b-a3b", target: Path | None = None,
            model: str = DEFAULT, gpu: str = "H200", sweep: Path | None = None,
            max_model_len: int | None = None, variant: Variant = AS_PROJECTED) -> None:
    """predictions.json of the shipped profile, or (`rule`) of the model projected from its config.json and
    the `references` (comma-separated calibrated profiles: the MoE one alone for a projection the dense
    Llama run never saw) with that rule (`pdexporter.sim.projection`), on `gpu`'s datasheet. `sweep`: another
    sweep's grid and model than the dense run's (a run on another GPU, such as an H100's injected table)."""
    run = DenseRun(sweep) if sweep else MODELS[model]
    spec = run.spec
    if rule is None and sweep:
        raise SystemExit("predict: another GPU or sweep needs --rule (the shipped profiles are the H200's)")
    profile = projected_profile(run, rule, references, gpu, max_model_len, variant)
    keys = list(spec.points())
    records = predict_records(profile, keys, spec.protocol, mode="fast")
    points = []
    for key in keys:
        figures = PointFigures.of(records[key])
        points.append({"chunk_size": key[0], "decode_batch_size": key[1], "new_prefill_tokens": key[2],
                       **{q: getattr(figures, METRIC_FIELDS[q]) for q in QUANTITIES}})
    target = target or run.results / "predictions.json"
    target.parent.mkdir(parents=True, exist_ok=True)
    named = profile.name + (f" ({rule} rule, from {references}{variant.words()})" if rule else "")
    doc = {"profile": named, "gpu": gpu,
           "calibration": profile.calibration, "note": profile.calibration_note,
           "provenance": profile.provenance.get("step_time"), "sweep": str(run.sweep.resolve().relative_to(ROOT)),
           "mode": "fast",
           "points": points}
    target.write_text(json.dumps(doc, indent=1) + "\n")
    print(f"wrote {target} ({len(points)} configurations, MODELLED by {doc['profile']}, {profile.calibration})")


def compare(results: Path | None = None, predictions: Path | None = None, out: Path | None = None,
            model: str = DEFAULT, none_fitted: bool = False) -> str:
    """`compare_projection` on the dense run, its held-out part being what the fitted grid leaves out (the
    whole grid where nothing was fitted, or where `none_fitted`: a run on another GPU, which no
    calibration read)."""
    run = MODELS[model]
    try:
        text = compare_projection(results or run.results, set() if none_fitted else run.fitted_grid(),
                                  predictions, out)
    except RecordError as exc:
        raise SystemExit(str(exc)) from None
    print(text)
    return text


def main(argv: list[str]) -> None:
    import argparse

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("what", nargs="?", choices=("predict", "compare", "profile"), default="predict",
                    help="profile: write the projected profile (--rule, --from, --gpu) to --out")
    ap.add_argument("--model", choices=sorted(MODELS), default=DEFAULT,
                    help="the dense run: its sweep, config.json, profile name and results directory")
    ap.add_argument("--results", type=Path, help="the GPU run's records (compare; default: the sweep's output)")
    ap.add_argument("--predictions", type=Path, help="predictions.json (default: in --results)")
    ap.add_argument("--out", type=Path, help="where comparison.csv/.md go (default: --results)")
    ap.add_argument("--rule", choices=("learned", "carry"), help="predict: a fresh projection with this rule")
    ap.add_argument("--from", dest="references", default="h200-qwen3-coder-30b-a3b",
                    help="predict --rule: the reference profiles, comma-separated")
    ap.add_argument("--gpu", default="H200", help="predict --rule: the GPU's datasheet (H100: the same compute, "
                    "less bandwidth and memory)")
    ap.add_argument("--sweep", type=Path, help="predict --rule: another sweep's grid and model (a run on another GPU)")
    ap.add_argument("--max-model-len", type=int, help="predict --rule: where the sweep's launcher sets none")
    ap.add_argument("--piecewise-gpu-ms", type=float,
                    help="predict --rule: a piecewise-graph step's GPU wait (none of the references has one)")
    ap.add_argument("--launch-eager-scale", type=float,
                    help="predict --rule: the eager launch times this (another host's level)")
    ap.add_argument("--launch-piecewise-per-layer-ms", type=float,
                    help="predict --rule: the piecewise launch, ms a layer (a host's launch floor)")
    ap.add_argument("--none-fitted", action="store_true",
                    help="compare: no calibration read this run (another GPU's): the whole grid is held out")
    args = ap.parse_args(argv)
    if args.what == "profile":
        if not args.rule or not args.out:
            raise SystemExit("profile: needs --rule and --out (the profile's file)")
        write_profile(args.rule, args.references, args.gpu, args.out, args.model)
    elif args.what == "predict":
        predict(args.rule, args.references, args.predictions, args.model, args.gpu, args.sweep, args.max_model_len,
                Variant(args.piecewise_gpu_ms, args.launch_eager_scale, args.launch_piecewise_per_layer_ms))
    else:
        compare(args.results, args.predictions, args.out, args.model, args.none_fitted)


if __name__ == "__main__":
    main(sys.argv[1:])
