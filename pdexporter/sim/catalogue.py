"""The embedded engine's profiles as a user sees them: the list a --profile name finds
(`profiles_sheet`, `pdexporter sim profiles`), and a new one projected from a model's config.json
(`project_profile`, `pdexporter sim profile-from-config`), written and described."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from pdexporter._internal.atomic import atomic_write_text
from pdexporter._internal.sheet import Column, Sheet, Shown, columns
from pdexporter._internal.writable import check_writable
from pdexporter.engines import DEFAULT_CHUNK_SIZE
from pdexporter.errors import ConfigError
from pdexporter.sim.profile import list_profiles, load_profile, user_profile_dirs

__all__ = [
    "profiles_sheet", "project_profile",
]


def profiles_sheet() -> Iterator[Shown]:
    """Every profile a --profile name finds (shipped, then the user's) and how it was obtained."""
    table = Sheet("embedded-engine profiles (calibrated: fitted to measurements; projected: from shapes "
                  "and datasheets, never measured)",
                  [Column(h, fold=True) for h in ("name", "origin", "GPU", "model", "calibration", "file")])
    seen: set[str] = set()
    for entry in list_profiles():
        shadowed = entry.name in seen
        seen.add(entry.name)
        try:
            prof = load_profile(entry.path)
        except ConfigError as exc:
            table.add_row(entry.name, entry.origin, "-", "-", f"[red]unreadable[/]: {exc}", str(entry.path))
            continue
        origin = entry.origin + (" (shadowed by the built-in)" if shadowed else "")
        table.add_row(entry.name, origin, prof.gpu.name, prof.model.name, prof.calibration, str(entry.path))
    yield table
    yield ("user profiles: " + ", ".join(str(d) for d in user_profile_dirs())
           + " (`pdexporter sim profile-from-config` writes there by default)")


def project_profile(config: str, gpu: str, *, carry_from: str | None = None, out: Path | None = None,
                    name: str | None = None, model_name: str | None = None, max_model_len: int | None = None,
                    chunk_size: int = DEFAULT_CHUNK_SIZE, dummy_weights: bool = False,
                    rule: str = "learned") -> Iterator[Shown]:
    """Project a profile from a config.json (`sim.modelconfig.profile_from_config`), write it
    (--out, else the user's profile directory), and describe it: where each part comes from, and
    the step times it projects."""
    from pdexporter.sim.modelconfig import load_config, profile_from_config
    from pdexporter.sim.steptime import StepComposition, StepTimeModel

    if out is not None:
        check_writable(out, directory=False, suffixes=(".yaml", ".yml"))
    data, source = load_config(config)
    src = Path(source)
    served = model_name or (src.parent.name if src.name == "config.json" else src.stem)
    prof = profile_from_config(data, gpu, name=name or (out.stem if out is not None else None), model_name=served,
                               source=source, carry_from=carry_from.split(",") if carry_from else None,
                               max_model_len=max_model_len, max_num_batched_tokens=chunk_size,
                               dummy_weights=dummy_weights, rule=rule)
    target = check_writable(out or user_profile_dirs()[0] / f"{prof.name}.yaml", "--out" if out else "output",
                            directory=False)
    target.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(target, prof.to_yaml())
    m, e = prof.model, prof.engine
    yield f"[bold]{prof.name}[/]: calibration [yellow]{prof.calibration.upper()}[/] (never measured) -> {target}"
    yield (f"  {m.architecture}: {m.num_layers} layers, {m.total_params / 1e9:.2f} B parameters "
           f"({m.active_params / 1e9:.2f} B active), {m.weights_bytes / 2**30:.1f} GiB of weights, "
           f"KV {m.kv_bytes_per_token / 1024:g} KiB a token, capacity {e.kv_capacity_tokens:,} tokens, "
           f"max_model_len {e.max_model_len:,}")
    parts = Sheet("where each part comes from", columns("part", "source"))
    for part, text in prof.provenance.items():
        parts.add_row(part, text)
    yield parts
    model = StepTimeModel(prof, max_num_batched_tokens=chunk_size)
    ctx = 4096
    steps = Sheet(f"projected step times at B={chunk_size} (MODELLED, ms)",
                  columns("step", "GPU", "CPU", "graph", justify="right", first="left"))
    for label, comp in (
        *((f"decode D={d} at {ctx} tokens", StepComposition.decode_batch(d, ctx)) for d in (1, 8, 32)),
        (f"prefill chunk {chunk_size - 8} + 8 decodes", StepComposition.of([(chunk_size - 8, 0)] + [(1, ctx)] * 8)),
    ):
        b = model.breakdown(comp)
        steps.add_row(label, f"{b.gpu_s * 1e3:.2f}", f"{b.cpu_s * 1e3:.2f}", f"{b.graph_mode} ({b.padded_tokens})")
    yield steps
    yield (f"use it: pdexporter sim serve --profile {prof.name if out is None else target}; calibrate it with "
           "a short sweep of the model on the GPU (docs/sim.md, 'Calibrating a new model')")
