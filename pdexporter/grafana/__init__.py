"""Grafana dashboards as code, and pushing them to a Grafana.

`build_all()` returns every dashboard as a dict; `render()` gives the exact bytes committed under
`dashboards/` (and copied into the Helm chart); `generate()` writes them; `stale_files()` names the
committed files that no longer match the code. `push.push_dashboards()` upserts them by uid.
"""

from __future__ import annotations

from pdexporter.grafana.generate import DASHBOARDS, build_all, generate, render, stale_files

__all__ = ["DASHBOARDS", "build_all", "generate", "render", "stale_files"]
