"""values.yaml and every ci/*-values.yaml validate against values.schema.json (JSON Schema draft-07)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jsonschema
import pytest

from tests.unit.helm.chart import CHART, VALUES_FILES, defaults, effective_values, merge, schema


def _errors(values: dict[str, Any]) -> list[str]:
    validator = jsonschema.Draft7Validator(schema())
    return [f"{'.'.join(map(str, e.absolute_path)) or '<root>'}: {e.message}" for e in validator.iter_errors(values)]


def test_schema_is_valid_draft_07() -> None:
    doc = schema()
    assert doc["$schema"] == "http://json-schema.org/draft-07/schema#"
    jsonschema.Draft7Validator.check_schema(doc)


def test_there_are_ci_values_files() -> None:
    names = {p.name for p in VALUES_FILES}
    for option in ("deployment", "sidecar", "selfcontained", "dashboards", "servicemonitor", "sweep",
                   "sweep-existing-configmap", "embedded-engine"):
        assert f"{option}-values.yaml" in names


@pytest.mark.parametrize("path", VALUES_FILES, ids=lambda p: p.name)
def test_values_file_validates(path: Path) -> None:
    assert _errors(effective_values(path)) == []


@pytest.mark.parametrize(
    ("override", "where"),
    [
        ({"exporter": {"mode": "daemonset"}}, "exporter.mode"),
        ({"exporter": {"probeDecode": -1}}, "exporter.probeDecode"),
        ({"exporter": {"injectEvery": "30 seconds"}}, "exporter.injectEvery"),
        ({"exporter": {"target": "vllm:8000"}}, "exporter.target"),
        ({"exporter": {"port": 70000}}, "exporter.port"),
        ({"exporter": {"probedecode": 4}}, "exporter"),  # a typo is an unknown key
        ({"exporter": {"resources": {"limit": {"cpu": 1}}}}, "exporter.resources"),
        ({"serviceMonitor": {"interval": "often"}}, "serviceMonitor.interval"),
        ({"image": {"pullPolicy": "Sometimes"}}, "image.pullPolicy"),
        ({"vllm": {"chunkSize": "8192"}}, "vllm.chunkSize"),
        ({"vllm": {"gpuMemoryUtilization": 1.5}}, "vllm.gpuMemoryUtilization"),
        ({"securityContext": {"seccompProfile": {"type": "Whatever"}}}, "securityContext.seccompProfile.type"),
        ({"dashboards": {"labels": {"grafana_dashboard": 1}}}, "dashboards.labels.grafana_dashboard"),
        ({"unknownTopLevel": True}, "<root>"),
    ],
)
def test_schema_rejects_bad_values(override: dict[str, Any], where: str) -> None:
    errors = _errors(merge(defaults(), override))
    assert any(e.startswith(f"{where}:") for e in errors), errors


@pytest.mark.parametrize(
    "override",
    [
        {"exporter": {"mode": "sidecar"}},  # sidecar needs the chart's vLLM
        {"sweep": {"enabled": True, "file": "reps: 1"}},  # no target
        {"sweep": {"enabled": True, "target": "http://vllm:8000"}},  # neither file nor existingConfigMap
    ],
)
def test_schema_rejects_incomplete_combinations(override: dict[str, Any]) -> None:
    assert _errors(merge(defaults(), override))


def _schema_paths(node: dict[str, Any], prefix: str = "") -> dict[str, dict[str, Any]]:
    paths: dict[str, dict[str, Any]] = {}
    for key, sub in node.get("properties", {}).items():
        path = f"{prefix}{key}"
        paths[path] = sub
        if sub.get("additionalProperties") is False:
            paths.update(_schema_paths(sub, f"{path}."))
    return paths


def _value_paths(node: Any, prefix: str = "") -> list[str]:
    paths = []
    if isinstance(node, dict):
        for key, sub in node.items():
            paths.append(f"{prefix}{key}")
            paths += _value_paths(sub, f"{prefix}{key}.")
    return paths


def test_schema_covers_every_value_and_describes_it() -> None:
    covered = _schema_paths(schema())
    for path in _value_paths(defaults()):
        parts = path.split(".")
        ancestors = [".".join(parts[:n]) for n in range(1, len(parts))]
        if any(a in covered and covered[a].get("additionalProperties") is not False for a in ancestors):
            continue  # inside a free-form map (labels, probes, securityContext)
        assert path in covered, f"values.yaml {path} has no schema entry"
        assert covered[path].get("description"), f"schema entry {path} has no description"


def test_every_schema_property_has_a_default() -> None:
    chart_values = defaults()
    values = _value_paths(chart_values)
    empty = {p for p in values if _get(chart_values, p) == {}}  # e.g. resources: {} (its keys are optional)
    for path in _schema_paths(schema()):
        if path != "global" and path.rpartition(".")[0] not in empty:
            assert path in values, f"schema property {path} is missing from values.yaml"


def _get(values: Any, dotted: str) -> Any:
    for part in dotted.split("."):
        values = values[part]
    return values


def test_hardened_and_unsized_defaults() -> None:
    v = defaults()
    sc = v["securityContext"]
    assert sc["runAsNonRoot"] is True and sc["readOnlyRootFilesystem"] is True
    assert sc["allowPrivilegeEscalation"] is False and sc["capabilities"]["drop"] == ["ALL"]
    assert sc["seccompProfile"]["type"] == "RuntimeDefault"
    assert v["podSecurityContext"]["runAsNonRoot"] is True
    assert v["podSecurityContext"]["seccompProfile"]["type"] == "RuntimeDefault"
    for path in ("exporter", "sweep", "vllm"):
        assert v[path]["resources"] == {}, f"{path}.resources must be unset by default"
    assert v["serviceMonitor"]["enabled"] is False and v["dashboards"]["enabled"] is False
    assert v["sweep"]["enabled"] is False and v["vllm"]["enabled"] is False
    assert v["dashboards"]["labels"] == {"grafana_dashboard": "1"}
    assert v["exporter"]["port"] == v["service"]["port"] == 18742


def test_values_yaml_is_the_file_helm_reads() -> None:
    assert (CHART / "values.yaml").is_file() and (CHART / "values.schema.json").is_file()
