"""`results/INDEX.md` is what `scripts/results_index.py` makes of the directories as committed: a directory
added, a campaign relabelled or a RUN.md retitled without the index re-made fails here (the fix is one command,
named in the message)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _script():  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location("results_index", ROOT / "scripts" / "results_index.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_committed_index_is_the_directories_as_they_are() -> None:
    made = _script().index(ROOT / "results")
    assert (ROOT / "results" / "INDEX.md").read_text(encoding="utf-8") == made, (
        "results/INDEX.md is stale: python scripts/results_index.py --out results/INDEX.md")


def test_the_index_reads_a_directory_it_was_never_shown(tmp_path: Path) -> None:
    d = tmp_path / "h100-x"
    (d / "8192" / "raw").mkdir(parents=True)
    (d / "8192" / "D4_P512.json").write_text("{}")
    (d / "8192" / "raw" / "D4_P512_rep0.json").write_text("{}")  # not a record
    (d / "campaign.yaml").write_text("id: s99-h100\ndate: 2026-12-31\nrole: validation\n")
    (d / "RUN.md").write_text("# A run | with a bar\n\ntext\n")
    (tmp_path / "planned").mkdir()
    (tmp_path / "planned" / "PLAN.md").write_text("intro\n# Next\n")
    text = _script().index(tmp_path)
    assert "| [h100-x](h100-x/) | s99-h100 | 2026-12-31 | validation | 1 | A run / with a bar |" in text
    assert "| [planned](planned/) | – | – | – | 0 | PLANNED: Next |" in text
    assert "2 directories; 1 campaigns (0 fit, 1 validation)." in text
