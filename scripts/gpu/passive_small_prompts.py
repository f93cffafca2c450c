"""Why a production prefill of P <= 2048 tokens costs the decodes less than an injected one of the same
engine (GPU session 18's passive runs): every one-chunk window, passive and injected, read back from its
raw timestamps. Per cell (D 6/8/12 x P 512/1024/2048): the step before the chunk step (a plain decode
step, or longer: another request's work the launch could hide behind), the reference the loss is
charged against (against the plain decode step), what the window holds besides the chunk step, joint
and overlapping prefills, and the chunk step's launch level (chunk step - reference >= 55 ms: slow).

    python3 scripts/gpu/passive_small_prompts.py PASSIVE_DIR INJECTED_DIR   # prints markdown
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from pdexporter.analysis.passive_model import DEFAULT_D as DB  # noqa: E402
from pdexporter.analysis.passive_model import DEFAULT_P as PB  # noqa: E402
from pdexporter.measure.passive import log_bin, probe_steps  # noqa: E402
from pdexporter.measure.protocol import StreamTrace  # noqa: E402
from pdexporter.measure.store import ResultsStore  # noqa: E402

CELLS = [(d, p) for d in (6, 8, 12) for p in (512, 1024, 2048)]
SLOW_MS = 55.0  # between the host's two launch levels (docs/analysis.md: ~35-45 and ~60-85 ms)


def _rows(root: str, requests: list[dict] | None) -> list[dict]:
    out = []
    store = ResultsStore(root)
    for record in store.iter_records():
        if record.config.chunk_size != 8192:
            continue
        for rep in record.reps:
            if rep.raw is None:  # no raw timestamps kept: nothing to re-read
                continue
            raw = store.load_raw(store.chunk_dir(8192) / rep.raw)
            info = (rep.model_extra or {}).get("passive") or {}
            base = rep.baseline.tpot_p50_ms
            ref = rep.interference.tpot_pre_injection_p50_ms or base
            thr = rep.interference.slow_step_threshold_ms
            chunks = rep.interference.chunk_step_times_ms or []
            traces = [StreamTrace.from_raw(p) for p in raw["probes"]]
            steps = probe_steps([(t.event_times_ns, t.event_tokens) for t in traces], base)
            t0, t1 = raw["t_inject_ns"], raw["t_first_ns"]
            win = [i for i, s in enumerate(steps) if t0 < s.end_ns <= t1 + base * 1e6 / 2]
            pre = [s.duration_ms for s in steps if s.end_ns <= t0][-12:]
            r = {"D": int(info.get("decode_batch_size", record.config.decode_batch_size)),
                 "P": int(info.get("prompt_tokens", record.config.new_prefill_tokens)),
                 "total": rep.derived.total_interference_ms, "ref": ref, "thr": thr,
                 "chunk": chunks[-1] if chunks else None, "n": len(chunks), "prefills": int(info.get("prefills") or 1),
                 "plain": float(np.median([x for x in pre if x <= thr])) if any(x <= thr for x in pre) else np.nan}
            if win and r["chunk"] is not None:
                k = min(win, key=lambda i: abs(steps[i].duration_ms - r["chunk"]))
                r["before"] = steps[k - 1].duration_ms if k >= 1 else np.nan
                r["other"] = r["total"] - (r["chunk"] - ref)
            if requests is not None:
                clock, ids = raw["t_inject_clock_ns"], set(info.get("request_ids") or [])
                r["overlap"] = sum(1 for q in requests if q["request_id"] not in ids and q["prefill_ms"] is not None
                                   and q["first_token_ns"] - q["prefill_ms"] * 1e6 < clock + t1
                                   and q["first_token_ns"] > clock + t0)
            out.append(r)
    return out


def _med(xs) -> str:
    xs = [x for x in xs if x is not None and np.isfinite(x)]
    return f"{np.median(xs):.0f}" if xs else "-"


def _cell(r: dict) -> tuple:
    return log_bin(r["D"], DB), log_bin(r["P"], PB)


def main(passive: str, injected: str) -> str:
    req_path = os.path.join(passive, "requests.jsonl")
    requests = [json.loads(x) for x in open(req_path)] if os.path.exists(req_path) else None
    pas, inj = _rows(passive, requests), _rows(injected, None)
    joint = _rows(os.path.join(passive, "joint"), None) if os.path.isdir(os.path.join(passive, "joint")) else []
    lines = [
        "| D | P | injected: n, slow, loss/stream, agg, chunk step, step before | passive eager: n (graph steps) | "
        "loss/stream, agg, chunk step | step before plain: n, loss, chunk | before longer: n, loss, chunk | "
        "ref - plain step | window besides chunk | joint, overlapping | fast level: n, loss, chunk | "
        "slow level: n, loss, chunk, agg (vs injected) |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for d, p in CELLS:
        i_ = [r for r in inj if _cell(r) == (d, p) and r["chunk"]]
        a = [r for r in pas if _cell(r) == (d, p) and r["prefills"] == 1]
        e = [r for r in a if r["P"] + r["D"] > 512 and r["n"] >= 1 and r["chunk"]]
        graph = sum(r["P"] + r["D"] <= 512 for r in a)
        plain = [r for r in e if r.get("before", np.nan) <= r["thr"]]
        longer = [r for r in e if r.get("before", np.nan) > r["thr"]]
        slow = [r for r in e if r["chunk"] - r["ref"] >= SLOW_MS]
        fast = [r for r in e if r["chunk"] - r["ref"] < SLOW_MS]
        j = sum(_cell(r) == (d, p) for r in joint)
        agg_i = np.median([r["total"] * r["D"] for r in i_]) if i_ else np.nan
        agg_s = np.median([r["total"] * r["D"] for r in slow]) if slow else np.nan
        vs = f" ({(agg_s - agg_i) / agg_i * 100:+.0f} %)" if np.isfinite(agg_s) and np.isfinite(agg_i) else ""

        def part(rs: list[dict]) -> str:
            return f"{len(rs)}, {_med([r['total'] for r in rs])}, {_med([r['chunk'] for r in rs])}"

        lines.append(
            f"| {d} | {p} | {len(i_)}, {sum(r['chunk'] - r['ref'] >= SLOW_MS for r in i_)}, "
            f"{_med([r['total'] for r in i_])}, {_med([r['total'] * r['D'] for r in i_])}, "
            f"{_med([r['chunk'] for r in i_])}, {_med([r.get('before') for r in i_])} | {len(e)} ({graph}) | "
            f"{_med([r['total'] for r in e])}, {_med([r['total'] * r['D'] for r in e])}, "
            f"{_med([r['chunk'] for r in e])} | {part(plain)} | {part(longer)} | "
            f"{_med([r['ref'] - r['plain'] for r in e])} | {_med([r.get('other') for r in e])} | "
            f"{j}, {sum(r.get('overlap', 0) > 0 for r in e)} | {part(fast)} | "
            f"{part(slow)}, {'-' if not np.isfinite(agg_s) else f'{agg_s:.0f}'}{vs} |"
        )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(main(sys.argv[1], sys.argv[2]), end="")
