"""Reading the chart without Helm: values files merged the way Helm merges them, the schema, templates."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[3]
CHART = ROOT / "helm" / "pdexporter"
VALUES_FILES = [CHART / "values.yaml", *sorted((CHART / "ci").glob("*-values.yaml"))]


def load_yaml(path: Path) -> Any:
    return yaml.safe_load(path.read_text()) or {}


def schema() -> dict[str, Any]:
    return json.loads((CHART / "values.schema.json").read_text())


def defaults() -> dict[str, Any]:
    return load_yaml(CHART / "values.yaml")


def merge(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    """Helm's coalescing: maps merge key by key, anything else replaces, null deletes the key."""
    out = copy.deepcopy(base)
    for key, value in override.items():
        if value is None:
            out.pop(key, None)
        elif isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def effective_values(path: Path) -> dict[str, Any]:
    """What Helm validates: the chart defaults with the file on top (plus the `global` Helm adds)."""
    values = defaults() if path.name == "values.yaml" else merge(defaults(), load_yaml(path))
    values.setdefault("global", {})
    return values
