"""Dashboard JSON files: build, render to stable bytes, write atomically, detect stale copies."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from pdexporter._internal.atomic import atomic_write_text
from pdexporter.grafana import interference_map, live

__all__ = [
    "DASHBOARDS", "build_all", "generate", "render", "stale_files",
]

# file name -> builder. The file name is the dashboard uid plus ".json".
DASHBOARDS: dict[str, Callable[[], dict[str, Any]]] = {
    live.FILE_NAME: live.build,
    interference_map.FILE_NAME: interference_map.build,
}


def build_all() -> dict[str, dict[str, Any]]:
    return {name: builder() for name, builder in DASHBOARDS.items()}


def render(dashboard: dict[str, Any]) -> str:
    """Stable text: sorted keys, two-space indent, one trailing newline (diff-friendly)."""
    return json.dumps(dashboard, indent=2, sort_keys=True, ensure_ascii=False, allow_nan=False) + "\n"


def generate(out_dirs: Iterable[Path]) -> list[Path]:
    """Write every dashboard into each directory; returns the files written."""
    rendered = {name: render(board) for name, board in build_all().items()}
    written: list[Path] = []
    for directory in out_dirs:
        for name, text in rendered.items():
            written.append(atomic_write_text(Path(directory) / name, text))
    return written


def stale_files(directory: Path) -> list[str]:
    """Dashboard files in `directory` that are missing or differ from what the code generates."""
    stale: list[str] = []
    for name, board in build_all().items():
        path = Path(directory) / name
        if not path.is_file() or path.read_text(encoding="utf-8") != render(board):
            stale.append(str(path))
    return stale
