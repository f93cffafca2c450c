"""values.yaml and every ci/*-values.yaml validate against values.schema.json (JSON Schema draft-07)."""

from __future__ import annotations

import re
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
                   "sweep-existing-configmap", "embedded-engine", "passive", "sweep-indexed", "networkpolicy"):
        assert f"{option}-values.yaml" in names


@pytest.mark.parametrize("path", VALUES_FILES, ids=lambda p: p.name)
def test_values_file_validates(path: Path) -> None:
    assert _errors(effective_values(path)) == []


@pytest.mark.parametrize(
    ("override", "where"),
    [
        ({"exporter": {"mode": "daemonset"}}, "exporter.mode"),
        ({"exporter": {"decodeBatchSize": -1}}, "exporter.decodeBatchSize"),
        ({"exporter": {"probeDecode": -1}}, "exporter.probeDecode"),  # the old name, read for one release
        ({"exporter": {"newPrefillTokens": 0}}, "exporter.newPrefillTokens"),
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
        ({"image": {"digest": "latest"}}, "image.digest"),
        ({"image": {"digest": "sha256:abc"}}, "image.digest"),
        ({"vllm": {"image": {"digest": "sha512:" + "a" * 128}}}, "vllm.image.digest"),
        ({"tests": {"image": {"digest": "sha256:" + "A" * 64}}}, "tests.image.digest"),
        ({"exporter": {"passive": "yes"}}, "exporter.passive"),
        ({"sweep": {"parallelism": 0}}, "sweep.parallelism"),
        ({"sweep": {"chunkSizes": [0]}}, "sweep.chunkSizes.0"),
        ({"sweep": {"chunkSizes": [2048, 2048]}}, "sweep.chunkSizes"),
        ({"vllm": {"apiKeySecret": {"name": "k", "key": ""}}}, "vllm.apiKeySecret.key"),
        ({"vllm": {"apiKeySecret": {"name": "k", "keys": "x"}}}, "vllm.apiKeySecret"),
        ({"vllm": {"writableDirs": {"Model_Cache": {"mountPath": "/models"}}}}, "vllm.writableDirs"),
        ({"vllm": {"writableDirs": {"models": {"mountPath": "models"}}}}, "vllm.writableDirs.models.mountPath"),
        ({"vllm": {"writableDirs": {"models": {"path": "/models"}}}}, "vllm.writableDirs.models"),
        ({"vllm": {"writableDirs": {"home": None}}}, "vllm.writableDirs"),  # HOME must stay writable
        ({"vllm": {"podSecurityContext": {"runAsUser": -1}}}, "vllm.podSecurityContext.runAsUser"),
        ({"networkPolicy": {"enabled": "true"}}, "networkPolicy.enabled"),
        ({"networkPolicy": {"egress": {"engine": {"cidrs": ["10.0.0.0"]}}}}, "networkPolicy.egress.engine.cidrs.0"),
        ({"networkPolicy": {"egress": {"engine": {"port": 70000}}}}, "networkPolicy.egress.engine.port"),
        ({"networkPolicy": {"egress": {"otlp": {"ports": [4317]}}}}, "networkPolicy.egress.otlp"),
        ({"networkPolicy": {"ingress": {"from": {"namespaceSelector": {}}}}}, "networkPolicy.ingress.from"),
        ({"tests": {"resources": {"limits": {"cpu": []}}}}, "tests.resources.limits.cpu"),
    ],
)
def test_schema_rejects_bad_values(override: dict[str, Any], where: str) -> None:
    errors = _errors(merge(defaults(), override))
    assert any(e.startswith(f"{where}:") for e in errors), errors


@pytest.mark.parametrize(
    "override",
    [
        {"exporter": {"mode": "sidecar"}},  # sidecar needs the chart's vLLM
        {"sweep": {"enabled": True, "target": "http://vllm:8000"}},  # neither file nor existingConfigMap
        {"exporter": {"passive": True, "injectEvery": "10s"}},
        {"sweep": {"enabled": True, "existingConfigMap": "my-sweep"}},  # the chart cannot read its chunk sizes
    ],
)
def test_schema_rejects_incomplete_combinations(override: dict[str, Any]) -> None:
    assert _errors(merge(defaults(), override))


@pytest.mark.parametrize(
    "override",
    [
        {"exporter": {"passive": True, "injectEvery": ""}},
        {"exporter": {"passive": True, "injectEvery": "off"}},
        {"exporter": {"passive": False, "injectEvery": "10s"}},
        # no target: the sweep file's own launcher starts the engines
        {"sweep": {"enabled": True, "file": "grid: {chunk_sizes: [2048]}"}},
        {"sweep": {"enabled": True, "existingConfigMap": "my-sweep", "chunkSizes": [2048, 8192]}},
        {"vllm": {"writableDirs": {"models": {"mountPath": "/models", "claimName": "weights"}}}},
    ],
)
def test_schema_accepts_the_documented_combinations(override: dict[str, Any]) -> None:
    assert _errors(merge(defaults(), override)) == []


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


# Optional Kubernetes fields the schema knows but the chart has no default for.
OPTIONAL_KUBERNETES_FIELDS = ("resources.claims",)


def test_every_schema_property_has_a_default() -> None:
    chart_values = defaults()
    values = _value_paths(chart_values)
    empty = {p for p in values if _get(chart_values, p) == {}}  # e.g. resources: {} (its keys are optional)
    for path, entry in _schema_paths(schema()).items():
        if path.endswith(OPTIONAL_KUBERNETES_FIELDS):
            continue
        if entry.get("description", "").startswith("Deprecated"):
            assert path not in values, f"{path} is deprecated: values.yaml sets its new name only"
            continue  # an old name, read when a user sets it (exporter.probeDecode -> decodeBatchSize)
        if path != "global" and path.rpartition(".")[0] not in empty:
            assert path in values, f"schema property {path} is missing from values.yaml"


def _get(values: Any, dotted: str) -> Any:
    for part in dotted.split("."):
        values = values[part]
    return values


# Kubernetes quantities, enough for the chart's values: CPU in cores, memory in bytes.
_SUFFIX = {
    "m": 1e-3,
    "": 1,
    "k": 1e3,
    "M": 1e6,
    "G": 1e9,
    "T": 1e12,
    "Ki": 2**10,
    "Mi": 2**20,
    "Gi": 2**30,
    "Ti": 2**40,
}


def quantity(value: str | int | float) -> float:
    number, suffix = re.fullmatch(r"([0-9.]+)([a-zA-Z]*)", str(value)).groups()  # type: ignore[union-attr]
    return float(number) * _SUFFIX[suffix]


def test_quantity_parser() -> None:
    assert quantity("100m") == 0.1 and quantity("1") == 1 and quantity(2) == 2
    assert quantity("128Mi") == 128 * 2**20 and quantity("1Gi") == 2**30 and quantity("1G") == 1e9


def test_hardened_defaults() -> None:
    v = defaults()
    for where, sc in (
        ("securityContext", v["securityContext"]),
        ("vllm.securityContext", v["vllm"]["securityContext"]),
    ):
        assert sc["runAsNonRoot"] is True and sc["readOnlyRootFilesystem"] is True, where
        assert sc["allowPrivilegeEscalation"] is False and sc["capabilities"]["drop"] == ["ALL"], where
        assert sc["privileged"] is False and sc["seccompProfile"]["type"] == "RuntimeDefault", where
    assert v["securityContext"]["runAsUser"] != 0
    assert "runAsUser" not in v["vllm"]["securityContext"], "vLLM's uid has one place: vllm.podSecurityContext"
    for where, pod in (("podSecurityContext", v["podSecurityContext"]),
                       ("vllm.podSecurityContext", v["vllm"]["podSecurityContext"])):
        assert pod["runAsNonRoot"] is True and pod["runAsUser"] != 0, where
        assert pod["seccompProfile"]["type"] == "RuntimeDefault", where
    # vLLM writes to HOME, HOME/.cache, /tmp and its compile caches: each is a writable dir
    dirs = v["vllm"]["writableDirs"]
    home = dirs["home"]["mountPath"]
    paths = {d["mountPath"] for d in dirs.values()}
    assert {home, f"{home}/.cache", "/tmp"} <= paths
    env = {name for d in dirs.values() for name in d.get("env", [])}
    assert {"TRITON_CACHE_DIR", "TORCHINDUCTOR_CACHE_DIR"} <= env
    assert v["vllm"]["apiKeySecret"] == {"name": "", "key": "api-key"}
    assert v["networkPolicy"]["enabled"] is True
    assert v["exporter"]["passive"] is False
    assert v["exporter"]["injectEvery"] == ""  # injection against a real engine is opt-in, as in the CLI
    assert v["exporter"]["tracesPort"] != v["exporter"]["port"]
    assert v["sweep"]["parallelism"] == 1 and v["sweep"]["chunkSizes"] == []
    for image in (v["image"], v["vllm"]["image"], v["tests"]["image"]):
        assert image["digest"] == ""


@pytest.mark.parametrize("path", ["exporter", "sweep", "tests"])
def test_default_resources_are_set_and_consistent(path: str) -> None:
    resources = defaults()[path]["resources"]
    for kind in ("cpu", "memory"):
        request, limit = resources["requests"][kind], resources["limits"][kind]
        assert 0 < quantity(request) <= quantity(limit), (path, kind, request, limit)


def test_exporter_probes_use_the_liveness_and_readiness_endpoints() -> None:
    exporter = defaults()["exporter"]
    assert exporter["livenessProbe"]["httpGet"] == {"path": "/livez", "port": "metrics"}
    assert exporter["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "metrics"}


def test_other_defaults() -> None:
    v = defaults()
    assert v["vllm"]["resources"] == {}, "vLLM's CPU/memory depend on the model: only the GPU limit is set"
    assert v["serviceMonitor"]["enabled"] is False and v["dashboards"]["enabled"] is False
    assert v["sweep"]["enabled"] is False and v["vllm"]["enabled"] is False
    assert v["dashboards"]["labels"] == {"grafana_dashboard": "1"}
    assert v["exporter"]["port"] == v["service"]["port"] == 18742


def test_values_yaml_is_the_file_helm_reads() -> None:
    assert (CHART / "values.yaml").is_file() and (CHART / "values.schema.json").is_file()


@pytest.mark.parametrize("text", ["500ms", "30s", "5m", "1h30m", "2d", "1.5s", ".5s", "45", "2.5", "1h0.5m",
                                  "30 seconds", "ten", "-1s", "1x", "s", "", "off", "1e3"])
def test_inject_every_pattern_is_the_exporters_duration_syntax(text: str) -> None:
    """exporter.injectEvery is passed to `run --inject-every`: the schema accepts exactly what
    pdexporter's one duration syntax reads ("" and "off" are the schema's other branch)."""
    from pdexporter._internal.durations import parse_duration
    from pdexporter.errors import ConfigError

    pattern = next(
        branch["pattern"]
        for branch in schema()["properties"]["exporter"]["properties"]["injectEvery"]["anyOf"]
        if "pattern" in branch
    )
    try:
        parse_duration(text)
        parsed = True
    except ConfigError:
        parsed = False
    assert bool(re.fullmatch(pattern, text)) == parsed, (text, parsed)
