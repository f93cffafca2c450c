"""The embedded engine's SGLang imitation against SGLang 0.5.15 measured on the H200, both modes.

Runs `pdexporter sim sweep` on the two SGLang sweep files (`sweeps/h200-sglang.yaml`, default mode;
`sweeps/h200-sglang-mixed.yaml`, `--enable-mixed-chunk`) with a profile, reads the predicted records
beside the measured ones (`results/h200-sglang0.5.15-*qwen3-coder-30b-a3b/8192`) and prints, per mode
and quantity (baseline TPOT, TPOT penalty, prefill duration = time to first token, aggregate
interference), the MAPE on the calibration's training configurations and on those held out
(D = 8 and P = 2048: other D, other P), and per configuration predicted / measured.

    python3 scripts/sglang_sim_calibration.py                     # the shipped SGLang profile
    python3 scripts/sglang_sim_calibration.py --profile h200-qwen3-coder-30b-a3b   # vLLM's step times
    python3 scripts/sglang_sim_calibration.py --fit --out p.yaml  # refit the free parameters on the training set

`--fit` fits the free step-time and engine-loop parameters by least squares on the log ratio
predicted / measured of the four quantities at the training configurations of both modes (one
profile for both: the same kernels; the mode is the scheduler's). Each evaluation is two simulated
sweeps on the virtual clock (~3 s each, run side by side). The held-out configurations are never
seen by the fit. `--json FILE` writes the comparison.
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from pdexporter.measure.store import load_record_file
from pdexporter.predict.calibrate import PointFigures
from pdexporter.sim.profile import load_profile

MODES = {
    "default": ("sweeps/h200-sglang.yaml", "results/h200-sglang0.5.15-qwen3-coder-30b-a3b/8192"),
    "mixed": ("sweeps/h200-sglang-mixed.yaml", "results/h200-sglang0.5.15-mixed-qwen3-coder-30b-a3b/8192"),
}
QUANTITIES = {
    "baseline_tpot": "baseline_p50_ms",
    "penalty": "penalty_mean_ms",
    "prefill_duration": "prefill_duration_ms",
    "aggregate_interference": "aggregate_interference_ms",
}
SHIPPED = "h200-sglang0.5.15-qwen3-coder-30b-a3b"
# (section, name, lower, upper): what --fit moves
FREE = [
    ("step_time", "fixed_ms", 0.5, 10.0),
    ("step_time", "launch_eager_ms", 10.0, 150.0),
    ("step_time", "moe_efficiency", 0.05, 1.0),
    ("step_time", "attention_efficiency", 0.02, 1.0),
    ("step_time", "prefix_attention_efficiency", 0.02, 1.0),
    ("step_time", "mixed_decode_us_per_chunk_token", 0.0, 100.0),
    ("step_time", "mixed_decode_free_tokens", 0.0, 2000.0),
    ("engine_loop", "request_overhead_ms", 0.0, 50.0),
]

Key = tuple[int, int, int]


def held_out(key: Key) -> bool:
    _, d, p = key
    return d == 8 or p == 2048


def figures(directory: Path) -> dict[Key, PointFigures]:
    out = {}
    for path in sorted(directory.glob("D*_P*.json")):
        record = load_record_file(path)
        out[record.key] = PointFigures.of(record)
    return out


def measured() -> dict[str, dict[Key, PointFigures]]:
    return {mode: figures(ROOT / rec) for mode, (_, rec) in MODES.items()}


def predict(profile: str, work: Path) -> dict[str, dict[Key, PointFigures]]:
    def one(mode: str) -> dict[Key, PointFigures]:
        sweep, _ = MODES[mode]
        out = work / mode
        cmd = [
            sys.executable,
            "-m",
            "pdexporter",
            "sim",
            "sweep",
            sweep,
            "--profile",
            profile,
            "--out",
            str(out),
        ]
        done = subprocess.run(cmd, check=False, cwd=ROOT, capture_output=True, text=True)
        if done.returncode:
            raise SystemExit(f"{' '.join(cmd)}: exit {done.returncode}\n{done.stderr[-2000:]}")
        return figures(out / "8192")

    with ThreadPoolExecutor(2) as pool:
        return dict(zip(MODES, pool.map(one, MODES)))


def errors(meas: dict[str, dict[Key, PointFigures]], pred: dict[str, dict[Key, PointFigures]]) -> dict:
    """mode -> quantity -> {"train": MAPE, "held_out": MAPE, "all": MAPE, "points": {key: [measured, predicted]}}."""
    out: dict = {}
    for mode in MODES:
        out[mode] = {}
        for q, field in QUANTITIES.items():
            points: dict[str, list[float]] = {}
            split: dict[str, list[float]] = {"train": [], "held_out": []}
            for key in sorted(meas[mode]):
                m, p = getattr(meas[mode][key], field), getattr(pred[mode].get(key), field, None)
                if m is None or p is None or m <= 0:
                    continue
                ape = abs(p - m) / m * 100
                points[f"D{key[1]}_P{key[2]}"] = [round(m, 2), round(p, 2)]
                split["held_out" if held_out(key) else "train"].append(ape)
            out[mode][q] = {
                "train": round(float(np.mean(split["train"])), 1) if split["train"] else None,
                "held_out": round(float(np.mean(split["held_out"])), 1) if split["held_out"] else None,
                "all": round(float(np.mean(split["train"] + split["held_out"])), 1),
                "points": points,
            }
    return out


def residuals(
    meas: dict[str, dict[Key, PointFigures]], pred: dict[str, dict[Key, PointFigures]]
) -> np.ndarray:
    res = []
    for mode in MODES:
        for key in sorted(meas[mode]):
            if held_out(key):
                continue
            for field in QUANTITIES.values():
                m, p = getattr(meas[mode][key], field), getattr(pred[mode].get(key), field, None)
                if m and m > 0:
                    res.append(math.log(max(p or 1e-3, 1e-3) / m))
    return np.array(res)


def write_profile(base: dict, x: np.ndarray, path: Path) -> None:
    data = json.loads(json.dumps(base))
    for (section, name, _, _), value in zip(FREE, x):
        data[section][name] = float(f"{value:.4g}")
    path.write_text(yaml.safe_dump(data, sort_keys=False, width=110), encoding="utf-8")


def fit(profile: str, out: Path, max_evals: int) -> None:
    from scipy.optimize import least_squares

    base = load_profile(profile).model_dump(mode="json")
    meas = measured()
    x0 = np.array([base[s][n] for s, n, _, _ in FREE], dtype=float)
    lo = np.array([f[2] for f in FREE])
    hi = np.array([f[3] for f in FREE])
    scale = np.maximum(np.abs(x0), 1.0)
    evals = 0
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)

        def fun(z: np.ndarray) -> np.ndarray:
            nonlocal evals
            evals += 1
            x = np.clip(z * scale, lo, hi)
            path = work / f"p{evals}.yaml"
            write_profile(base, x, path)
            r = residuals(meas, predict(str(path), work / f"run{evals}"))
            print(
                f"eval {evals}: rms log {float(np.sqrt(np.mean(r**2))):.4f} "
                + " ".join(f"{n}={v:.4g}" for (_, n, _, _), v in zip(FREE, x)),
                flush=True,
            )
            return r

        sol = least_squares(
            fun, x0 / scale, bounds=(lo / scale, hi / scale), diff_step=0.03, max_nfev=max_evals, x_scale=1.0
        )
        write_profile(base, np.clip(sol.x * scale, lo, hi), out)
    print(f"wrote {out} ({evals} evaluations, {sol.message})")


def markdown(result: dict, label: str) -> str:
    lines = [
        f"{label}: MAPE % (train / held out / all 16)",
        "",
        "| mode | " + " | ".join(QUANTITIES) + " |",
        "|---|" + "---|" * len(QUANTITIES),
    ]
    for mode in MODES:
        cells = [
            f"{result[mode][q]['train']} / {result[mode][q]['held_out']} / {result[mode][q]['all']}"
            for q in QUANTITIES
        ]
        lines.append(f"| {mode} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--profile", default=SHIPPED)
    parser.add_argument("--fit", action="store_true")
    parser.add_argument("--out", type=Path, default=Path("fitted.yaml"))
    parser.add_argument("--max-evals", type=int, default=60)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    if args.fit:
        fit(args.profile, args.out, args.max_evals)
        return
    with tempfile.TemporaryDirectory() as tmp:
        result = errors(measured(), predict(args.profile, Path(tmp)))
    print(markdown(result, args.profile))
    print()
    for mode in MODES:
        print(f"{mode}: measured -> predicted (ms; * held out)")
        for q in QUANTITIES:
            pts = result[mode][q]["points"]
            row = []
            for k, (m, p) in pts.items():
                d, pp = (int(x) for x in k[1:].split("_P"))
                row.append(f"{'*' if held_out((8192, d, pp)) else ''}{k} {m:g}->{p:g}")
            print(f"  {q}: " + ", ".join(row))
    if args.json:
        args.json.write_text(
            json.dumps({"profile": args.profile, "held_out": "D = 8 or P = 2048", **result}, indent=1),
            encoding="utf-8",
        )


if __name__ == "__main__":
    main()
