"""Copy the campaign variation `pdexporter validate` measured (held_out.json) into the profile of the
engine it was measured on, so that a table the embedded engine makes with that profile carries it
(`sim.profile.CampaignVariation`; `export-table` folds it in as `--campaign-variation` does).

    python scripts/profile_variation.py results/h200-held-out/held_out.json \\
        pdexporter/sim/profiles/h200-qwen3-coder-30b-a3b.yaml
    python scripts/profile_variation.py results/h200-held-out/held_out.json \\
        pdexporter/sim/profiles/h200-llama-3.1-8b-instruct.yaml --borrowed-from h200-qwen3-coder-30b-a3b

The second form writes it as borrowed (`CampaignVariation.borrowed_from`): a shipped profile of another
model or GPU, made from the measured one by a projection or a calibration, as a fresh one would carry it.

The profile's other keys are left as they are (its `campaign_variation:` block, the last, is
replaced); `tests/unit/sim/test_profile_variation.py` fails when the two disagree."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import yaml

from pdexporter._internal.atomic import atomic_write_text
from pdexporter.analysis.campaigns import load_variation
from pdexporter.sim.profile import CampaignVariation, parse_profile

KEY = "campaign_variation:"


def block(held_out: Path, source: str, borrowed_from: str | None = None) -> str:
    variation, _ = load_variation(held_out)
    value = CampaignVariation.model_validate({"source": source, "borrowed_from": borrowed_from, **variation})
    return yaml.safe_dump({"campaign_variation": value.model_dump(mode="json", exclude_none=True)},
                          sort_keys=False, width=110)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("held_out", type=Path)
    parser.add_argument("profile", type=Path)
    parser.add_argument("--source", help="how the profile names held_out.json (default: the path as given)")
    parser.add_argument("--borrowed-from", help="the profile it was measured for (this one borrows it)")
    args = parser.parse_args(argv)
    text = args.profile.read_text()
    kept = text.split("\n" + KEY, 1)[0].rstrip("\n") + "\n"
    new = kept + block(args.held_out, args.source or str(args.held_out), args.borrowed_from)
    parse_profile(yaml.safe_load(new), source=str(args.profile))  # still a profile
    atomic_write_text(args.profile, new)
    lent = f", borrowed from {args.borrowed_from}" if args.borrowed_from else ""
    print(f"{args.profile}: campaign_variation from {args.source or args.held_out}{lent}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
