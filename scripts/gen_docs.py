"""Regenerate the parts of docs/ that are generated from code: the window-quantity table of
docs/metrics.md (from pdexporter.measure.quantities).   python scripts/gen_docs.py"""

from __future__ import annotations

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from pdexporter.measure.quantities import markdown_table  # noqa: E402

BEGIN, END = "<!-- quantities:begin -->", "<!-- quantities:end -->"


def render(text: str) -> str:
    pattern = re.compile(re.escape(BEGIN) + ".*?" + re.escape(END), re.S)
    if not pattern.search(text):
        raise SystemExit(f"docs/metrics.md: markers {BEGIN} ... {END} missing")
    return pattern.sub(f"{BEGIN}\n{markdown_table()}\n{END}", text)


def main() -> None:
    path = ROOT / "docs" / "metrics.md"
    path.write_text(render(path.read_text(encoding="utf-8")), encoding="utf-8")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
