"""`pdexporter dashboards generate` as a job: where the dashboard files go (a checkout's dashboards/
and the Helm chart's copies), and either their rewrite or, with `check`, the stale ones named."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from pdexporter._internal.writable import check_writable
from pdexporter.errors import ConfigError
from pdexporter.grafana.generate import generate, stale_files

__all__ = [
    "DEFAULT_CHART", "DEFAULT_OUT", "Generated", "generate_dashboards", "in_checkout",
]


DEFAULT_OUT = Path("dashboards")
DEFAULT_CHART = Path("helm/pdexporter")


def in_checkout(directory: Path) -> bool:
    """Is `directory` the root of a pdexporter source tree (where dashboards/ is committed)?"""
    try:
        text = (directory / "pyproject.toml").read_text(encoding="utf-8")
    except OSError:
        return False
    return re.search(r'^name\s*=\s*"pdexporter"', text, re.M) is not None


@dataclass
class Generated:
    notes: list[str] = field(default_factory=list)  # what `check` found (stderr)
    written: list[Path] = field(default_factory=list)
    stale: bool = False


def generate_dashboards(out: Path | None = None, chart: Path | None = DEFAULT_CHART, *,
                        check: bool = False) -> Generated:
    """Rewrite the dashboard files in `out` (default: dashboards/ of the checkout in the current
    directory) and the chart's copies (skipped where the default chart is absent); with `check`,
    write nothing and name the stale files."""
    if out is None:
        if not in_checkout(Path.cwd()):
            raise ConfigError(f"--out not given and {Path.cwd()} is not a pdexporter checkout (no pyproject.toml "
                              "naming pdexporter): pass --out DIR")
        out = DEFAULT_OUT
    targets = [out]
    if chart is not None and chart.is_dir():
        targets.append(chart / "dashboards")
    elif chart is not None and chart != DEFAULT_CHART:
        raise ConfigError(f"--chart {chart}: not a directory")
    if check:
        stale = [path for directory in targets for path in stale_files(directory)]
        notes = [f"[red]stale:[/] {path}" for path in stale]
        notes.append("run `pdexporter dashboards generate` and commit the result" if stale
                     else f"dashboards up to date in {', '.join(map(str, targets))}")
        return Generated(notes, stale=bool(stale))
    for flag, target in zip(("--out", "--chart"), targets):
        check_writable(target, flag)
    return Generated(written=generate(targets))
