"""The offload verdict from `decision.json`, in plain Python: this module imports nothing beyond
the standard library (`math`), so a router can copy it whole (a test holds it to that).

Two modes (docs/disaggregation.md):

- **two-arm** (the default when the document has a `two_arm` section, i.e. both arms were
  measured): offloading saves the D running decodes the time the prefill would cost them
  colocated, minus what admitting the offloaded request still costs them on the decode instance,

      saved_ms    = colocated aggregate interference - offloaded aggregate interference

  and the offloaded request pays the difference of its two TTFTs,

      ttft_cost_ms = offloaded TTFT (prefill alone elsewhere + KV transfer + admission) - colocated TTFT.

  With SLOs (`tpot_slo_ms` on the running decodes' TPOT while the prefill runs, `ttft_slo_ms` on
  the request's TTFT), an arm that holds every SLO given beats one that does not; otherwise, or
  when both (or neither) hold them, offload iff saved_ms > ttft_cost_ms: the total latency of the
  D + 1 requests goes down.
- **seed**: the seed's rule, offload iff the aggregate interference exceeds the transfer time (a
  constant, the seed's 50 ms, unless a transfer model was measured or a time is given).

Every model in the document is linear in named features of (D, P, B) (`feature`), so evaluating
one is a dot product.
"""

import math

__all__ = [
    "SEED_RULE", "TWO_ARM_RULE", "evaluate_decision", "feature", "linear", "offload_threshold", "transfer_time",
]

SEED_RULE = "the seed's rule: offload iff the prefill's aggregate interference exceeds the transfer time"
TWO_ARM_RULE = ("offload iff the decode time it saves (colocated - offloaded aggregate interference) exceeds what "
                "the request pays in TTFT (offloaded - colocated TTFT); an arm that alone holds every SLO given wins")


def feature(name, d, p, b):
    """One regressor of the linear models, from D decodes, a P-token prefill, chunk size B.
    Token counts enter in thousands so coefficients stay readable."""
    budget = b - d
    chunks = math.ceil(p / budget)
    kp = p / 1000.0
    if name == "1":
        return 1.0
    if name == "d":
        return float(d)
    if name == "p":
        return kp
    if name == "p2":
        return kp * kp
    if name == "d_p":
        return d * kp
    if name == "chunks":
        return float(chunks)
    if name == "d_chunks":
        return float(d * chunks)
    if name == "chunk":
        return min(p, budget) / 1000.0
    if name == "chunk_p":
        return min(p, budget) / 1000.0 * kp
    raise ValueError(f"unknown feature {name!r} in decision document")


def linear(model, d, p, b):
    """A `{"features": [...], "coefficients": {...}}` model at (D, P, B)."""
    k = model["coefficients"]
    return sum(k[name] * feature(name, d, p, b) for name in model["features"])


def transfer_time(transfer, p):
    """The transfer model: fixed_ms + P x ms_per_token (ms_per_token = bytes per token / bandwidth)."""
    return transfer["fixed_ms"] + transfer["ms_per_token"] * p


def _cost(doc, d, p, b, n):
    """The colocated aggregate interference from the fitted cost model (D x per-stream, ms)."""
    model = doc["model"]
    if model["name"] == "context_aware":
        k = model["coefficients"]
        per_stream = (n * (k["alpha0_ms"] + k["alpha1_ms_per_decode"] * d) + k["gamma_ms_per_token"] * p
                      + k["beta_ms_per_token_pair"] * p * (p + 1) / 2
                      + k.get("sigma0_ms", 0.0) + k.get("sigma1_ms_per_token", 0.0) * p)
    elif model["name"] == "seed_per_chunk":
        table = model["penalty_per_chunk_ms"]
        sizes = sorted(int(s) for s in table)
        chosen = b if b in sizes else min(sizes, key=lambda s: (abs(math.log2(s) - math.log2(b)), s))
        ds, pis = table[str(chosen)]["decode_batch_size"], table[str(chosen)]["penalty_ms"]
        if d <= ds[0]:
            pi = pis[0]
        elif d >= ds[-1]:
            pi = pis[-1]
        else:
            i = max(j for j in range(len(ds)) if ds[j] <= d)
            pi = pis[i] + (pis[i + 1] - pis[i]) * (d - ds[i]) / (ds[i + 1] - ds[i])
        per_stream = n * pi
    else:
        raise ValueError(f"unknown model {model['name']!r} in decision document")
    return d * per_stream


def _ms(x):
    """1234.5 -> '1.2 s', 40.2 -> '40 ms'."""
    if abs(x) >= 1000:
        return f"{x / 1000:.1f} s"
    return f"{x:.0f} ms" if abs(x) >= 10 else f"{x:.1f} ms"


def evaluate_decision(doc, d, p, b, transfer_ms=None, *, tpot_slo_ms=None, ttft_slo_ms=None, mode=None):
    """Offload or not for D running decodes, a P-token prefill and chunk size B, from decision.json.

    Returns a dict: `offload`, `verdict` (one line), `mode`, the seed's numbers (`cost_ms`,
    `transfer_ms`, `margin_ms`, `chunks`, `model`, `in_fitted_range`) and, in two-arm mode, both
    arms' numbers (`saved_ms`, `ttft_cost_ms`, TTFTs, TPOTs, `slos`)."""
    if b - d <= 0:
        raise ValueError(f"chunk size {b} leaves no room beside {d} decodes")
    if p < 1 or d < 0:
        raise ValueError(f"need P >= 1 and D >= 0 (got P={p}, D={d})")
    arms = doc.get("two_arm")
    mode = mode or ("two-arm" if arms else "seed")
    if mode not in ("two-arm", "seed"):
        raise ValueError(f"mode {mode!r}: expected two-arm or seed")
    if mode == "two-arm" and not arms:
        raise ValueError("two-arm mode needs a decision document with both arms (export-table --offloaded)")
    n = math.ceil(p / (b - d))
    cost = _cost(doc, d, p, b, n)
    transfer_model = (arms or {}).get("transfer") or {}
    if transfer_ms is not None:
        transfer, transfer_source = float(transfer_ms), "given"
    elif transfer_model.get("source") in ("measured", "given"):
        transfer, transfer_source = transfer_time(transfer_model, p), transfer_model["source"]
    else:
        transfer, transfer_source = float(doc["transfer_ms_default"]), "seed-constant"
    rng = doc.get("valid_range") or {}

    def inside(name, value):
        bounds = rng.get(name)
        return bounds is None or bounds[0] <= value <= bounds[1]

    out = {
        "mode": mode,
        "cost_ms": cost,
        "transfer_ms": transfer,
        "transfer_source": transfer_source,
        "margin_ms": cost - transfer,
        "chunks": n,
        "model": doc["model"]["name"],
        "in_fitted_range": inside("decode_batch_size", d) and inside("new_prefill_tokens", p)
        and inside("chunk_size", b),
    }
    if mode == "seed":
        offload = cost > transfer
        relation = ">" if offload else "<="
        out.update(offload=offload, rule=SEED_RULE, verdict=(
            f"{'offload' if offload else 'keep local'} (the seed's rule): interference {_ms(cost)} {relation} "
            f"transfer {_ms(transfer)} ({transfer_source})"))
        return out

    off_cost = d * linear(arms["offloaded_cost_per_stream"], d, p, b)
    saved = cost - off_cost
    col_ttft = linear(arms["colocated_ttft"], d, p, b)
    prefill_part = linear(arms["offloaded_prefill"], 0, p, b)
    decode_part = linear(arms["offloaded_decode"], d, p, b)
    transfer_in_ttft = transfer if arms.get("decode_side_excludes_transfer") else 0.0
    off_ttft = prefill_part + transfer_in_ttft + decode_part
    ttft_cost = off_ttft - col_ttft
    tpot_col = linear(arms["colocated_tpot"], d, p, b) if arms.get("colocated_tpot") else None
    tpot_off = linear(arms["offloaded_tpot"], d, p, b) if arms.get("offloaded_tpot") else None
    slos = {}
    if tpot_slo_ms is not None and d > 0 and tpot_col is not None and tpot_off is not None:
        slos["TPOT"] = (tpot_col <= tpot_slo_ms, tpot_off <= tpot_slo_ms)
    if ttft_slo_ms is not None:
        slos["TTFT"] = (col_ttft <= ttft_slo_ms, off_ttft <= ttft_slo_ms)
    held_col = all(v[0] for v in slos.values())
    held_off = all(v[1] for v in slos.values())
    if slos and held_off and not held_col:
        offload, reason = True, "only offloading holds the SLOs"
    elif slos and held_col and not held_off:
        offload, reason = False, "only keeping it local holds the SLOs"
    else:
        offload = saved > ttft_cost
        reason = "decode time saved vs TTFT paid"
    arm = 1 if offload else 0
    if not slos:
        slo_text = ""
    else:
        held = [name for name, v in slos.items() if v[arm]]
        missed = [name for name, v in slos.items() if not v[arm]]
        if not missed:
            slo_text = ", both SLOs held" if len(held) == 2 else f", {held[0]} SLO held"
        else:
            slo_text = f", no arm holds every SLO ({' and '.join(missed)} missed this way)"
    decodes = f"the {d} running decode{'s' if d != 1 else ''}"
    sign = "+" if ttft_cost >= 0 else "-"
    if offload:
        verdict = (f"offload: saves {decodes} {_ms(saved)} in total, costs this request {sign}{_ms(abs(ttft_cost))} "
                   f"TTFT{slo_text}")
    else:
        verdict = (f"keep local: offloading would save {decodes} {_ms(saved)} in total but cost this request "
                   f"{sign}{_ms(abs(ttft_cost))} TTFT{slo_text}")
    out.update(
        offload=offload, rule=TWO_ARM_RULE, reason=reason, verdict=verdict, saved_ms=saved, ttft_cost_ms=ttft_cost,
        colocated_cost_ms=cost, offloaded_cost_ms=off_cost, colocated_ttft_ms=col_ttft, offloaded_ttft_ms=off_ttft,
        offloaded_ttft_split_ms={"prefill": prefill_part, "transfer": transfer_in_ttft, "decode_side": decode_part},
        colocated_tpot_ms=tpot_col, offloaded_tpot_ms=tpot_off,
        slos={name: {"colocated": v[0], "offloaded": v[1]} for name, v in slos.items()},
    )
    return out


def offload_threshold(doc, d, b, *, tpot_slo_ms=None, ttft_slo_ms=None, mode=None, p_max=131072, step=64):
    """The prefill length above which offloading wins at D decodes and chunk size B: the smallest
    P on a grid of `step` tokens from which the verdict is "offload" up to `p_max` (None: it never
    is; `step` when it always is). Scanned, not solved: the verdict need not be monotone in P."""
    if b - d <= 0:
        return None
    threshold = None
    for p in range(p_max, 0, -step):
        if evaluate_decision(doc, d, p, b, tpot_slo_ms=tpot_slo_ms, ttft_slo_ms=ttft_slo_ms, mode=mode)["offload"]:
            threshold = p
        else:
            break
    return threshold
