"""The index of `results/`: one row per results directory, made from what each directory holds, so it cannot
drift from them (`tests/unit/test_results_index.py` holds the committed `results/INDEX.md` to this script).

    python scripts/results_index.py [--results results] [--out results/INDEX.md]

The directories are those git tracks under `results/` (a command run without `--out` writes its local outputs there,
ignored by git: they are not the repository's); outside a git checkout, every directory. Per directory: its GPU
campaign (`campaign.yaml`: id, date, role; a directory without one holds derived
analysis or records no held-out scoring reads), how many records it holds (`D*_P*.json` below a chunk-size
folder, the passive events' `joint/` and `merged/` folders left out), and the title of its RUN.md (else of its
PLAN.md: planned, not run). Pure file reading; the markdown is sorted by directory name.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
_RECORD = re.compile(r"D\d+_P\d+\.json$")


def _title(path: Path) -> str:
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.startswith("# "):
            return line[2:].strip().replace("|", "/")
    return ""


def _records(directory: Path) -> int:
    return sum(1 for p in directory.rglob("D*_P*.json")
               if _RECORD.search(p.name) and p.parent.name.isdigit()
               and not {"joint", "merged"} & set(p.relative_to(directory).parts))


def _campaign(directory: Path) -> tuple[str, str, str]:
    path = directory / "campaign.yaml"
    if not path.is_file():
        return "–", "–", "–"
    doc = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    return str(doc.get("id", "?")), str(doc.get("date", "?")), str(doc.get("role", "?"))


def _directories(results: Path) -> list[Path]:
    """The directories of `results` that git tracks files in, else (no git, not a checkout, nothing tracked) every
    one."""
    every = sorted(p for p in results.iterdir() if p.is_dir() and not p.name.startswith("."))
    try:
        listed = subprocess.run(["git", "-C", str(results), "ls-files", "-z", "."], capture_output=True, check=True,
                                timeout=60).stdout.decode("utf-8", "replace")
    except (OSError, subprocess.SubprocessError):
        return every
    tracked = {name.split("/", 1)[0] for name in listed.split("\0") if "/" in name}
    return [p for p in every if p.name in tracked] if tracked else every  # nothing tracked there: a folder of one's own


def index(results: Path) -> str:
    rows = ["# The results directories", "",
            "Made by `python scripts/results_index.py` from each directory's `campaign.yaml`, records and RUN.md "
            "(PLAN.md where nothing ran yet); `scripts/results.sh` re-derives what is in them. A campaign's role "
            "`fit` may be read by the fits, `validation` by none (docs/analysis.md, \"Held-out campaigns\"); "
            "'–': no campaign file (derived analysis, or records no held-out scoring reads).", "",
            "| directory | campaign | date | role | records | what it is |", "|---|---|---|---|---|---|"]
    dirs = _directories(results)
    campaigns = set()
    for d in dirs:
        cid, date, role = _campaign(d)
        if cid != "–":
            campaigns.add((cid, role))
        run, plan = d / "RUN.md", d / "PLAN.md"
        what = _title(run) if run.is_file() else (f"PLANNED: {_title(plan)}" if plan.is_file() else "")
        rows.append(f"| [{d.name}]({d.name}/) | {cid} | {date} | {role} | {_records(d)} | {what} |")
    rows += ["", f"{len(dirs)} directories; {len(campaigns)} campaigns "
             f"({sum(r == 'fit' for _, r in campaigns)} fit, {sum(r == 'validation' for _, r in campaigns)} "
             "validation).", ""]
    return "\n".join(rows)


def main(argv: list[str]) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--results", type=Path, default=ROOT / "results")
    ap.add_argument("--out", type=Path, help="write here (default: stdout)")
    args = ap.parse_args(argv)
    if not args.results.is_dir():
        raise SystemExit(f"{args.results}: no such directory")
    text = index(args.results)
    if args.out:
        args.out.write_text(text, encoding="utf-8")
    else:
        sys.stdout.write(text)


if __name__ == "__main__":
    main(sys.argv[1:])
