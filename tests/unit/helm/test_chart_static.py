"""Checks of the chart that need no Helm: value references, labels, security, dashboards copies, image."""

from __future__ import annotations

import re
from typing import Any

import yaml

from pdexporter import __version__
from pdexporter.exporter.metrics import DEFAULT_PORT
from pdexporter.grafana import DASHBOARDS
from tests.unit.helm.chart import CHART, ROOT, defaults

TEMPLATES = sorted((CHART / "templates").rglob("*"))
TEMPLATE_FILES = [p for p in TEMPLATES if p.is_file()]
VALUE_REF = re.compile(r"\.Values((?:\.[A-Za-z_][A-Za-z0-9_]*)+)")


def _lookup(values: Any, dotted: str) -> bool:
    node = values
    for part in dotted.strip(".").split("."):
        if not isinstance(node, dict) or part not in node:
            return False
        node = node[part]
    return True


def test_every_values_reference_in_templates_exists() -> None:
    values = defaults()
    missing = []
    for path in TEMPLATE_FILES:
        for match in VALUE_REF.finditer(path.read_text()):
            if not _lookup(values, match.group(1)):
                missing.append(f"{path.relative_to(CHART)}: .Values{match.group(1)}")
    assert not missing, missing
    # and the check can see something
    assert sum(len(VALUE_REF.findall(p.read_text())) for p in TEMPLATE_FILES) > 80


def test_every_top_level_value_is_used_by_a_template() -> None:
    text = "\n".join(p.read_text() for p in TEMPLATE_FILES)
    for key in defaults():
        assert f".Values.{key}" in text, f"values.yaml {key} is never used"


def test_chart_metadata() -> None:
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert chart["apiVersion"] == "v2" and chart["name"] == "pdexporter" and chart["type"] == "application"
    assert chart["appVersion"] == __version__
    assert re.fullmatch(r"\d+\.\d+\.\d+", chart["version"])


def test_required_templates_exist() -> None:
    names = {p.relative_to(CHART / "templates").as_posix() for p in TEMPLATE_FILES}
    for name in ("_helpers.tpl", "NOTES.txt", "deployment.yaml", "service.yaml", "servicemonitor.yaml",
                 "dashboards-configmap.yaml", "sweep-job.yaml", "sweep-configmap.yaml", "vllm.yaml",
                 "serviceaccount.yaml", "networkpolicy.yaml", "tests/test-metrics.yaml"):
        assert name in names, name


def test_labels_come_from_helpers() -> None:
    helpers = (CHART / "templates" / "_helpers.tpl").read_text()
    for label in ("app.kubernetes.io/name", "app.kubernetes.io/instance", "app.kubernetes.io/version",
                  "app.kubernetes.io/managed-by", "app.kubernetes.io/part-of", "app.kubernetes.io/component"):
        assert label in helpers
    for path in TEMPLATE_FILES:
        if path.suffix == ".yaml":
            text = path.read_text()
            assert "app.kubernetes.io/" not in text, f"{path.name}: labels must come from _helpers.tpl"
            if "kind:" in text:
                assert 'include "pdexporter.labels"' in text or 'include "pdexporter.componentLabels"' in text, path


def test_every_container_gets_a_security_context() -> None:
    for path in TEMPLATE_FILES:
        text = path.read_text()
        if "containers:" not in text or path.name == "_helpers.tpl":
            continue
        if path.name == "vllm.yaml":
            assert ".Values.vllm.securityContext" in text and ".Values.vllm.podSecurityContext" in text
            continue
        assert ".Values.podSecurityContext" in text, path.name
        assert ".Values.securityContext" in text or "pdexporter.exporterContainer" in text, path.name
    helpers = (CHART / "templates" / "_helpers.tpl").read_text()
    container = helpers.split('define "pdexporter.exporterContainer"')[1]
    assert "toYaml .Values.securityContext" in container
    assert "mountPath: /tmp" in container and "mountPath: /results" in container


def test_chart_dashboards_are_byte_copies_of_the_repository_ones() -> None:
    chart_copies = {p.name: p.read_bytes() for p in (CHART / "dashboards").glob("*.json")}
    repo = {p.name: p.read_bytes() for p in (ROOT / "dashboards").glob("*.json")}
    assert set(chart_copies) == set(repo) == set(DASHBOARDS)
    assert chart_copies == repo
    text = (CHART / "templates" / "dashboards-configmap.yaml").read_text()
    assert '.Files.Glob "dashboards/*.json"' in text


def test_every_image_reference_goes_through_the_digest_helper() -> None:
    """An image set by tag alone cannot be pinned: every `image:` line uses pdexporter.image(Ref)."""
    for path in TEMPLATE_FILES:
        for line in path.read_text().splitlines():
            if re.match(r"\s*image:", line):
                assert 'include "pdexporter.image' in line, f"{path.name}: {line.strip()}"
    helpers = (CHART / "templates" / "_helpers.tpl").read_text()
    assert 'printf "%s@%s" .image.repository .image.digest' in helpers


def test_probe_paths_are_served_by_the_exporter() -> None:
    """The chart's liveness/readiness paths are routes of the exporter's own aiohttp app."""
    from prometheus_client import CollectorRegistry

    from pdexporter.exporter.server import metrics_app

    routes = {r.resource.canonical for r in metrics_app(CollectorRegistry()).router.routes()}  # type: ignore[union-attr]
    exporter = defaults()["exporter"]
    for probe in ("livenessProbe", "readinessProbe"):
        assert exporter[probe]["httpGet"]["path"] in routes, (probe, routes)
    assert {"/livez", "/readyz", "/healthz", "/metrics"} <= routes


def _dockerfile_from(text: str, build_args: dict[str, str]) -> str:
    """The base image the FROM line names, its ${VAR} / ${VAR:+word} expanded by bash, whose
    parameter expansion is the POSIX one BuildKit's Dockerfile lexer implements (no Docker here)."""
    import shutil
    import subprocess

    defaults_ = dict(re.findall(r"^ARG (\w+)=(.*)$", text.split("\nFROM ")[0], re.M))
    (line,) = re.findall(r"^FROM (.+)$", text, re.M)
    env = {**defaults_, **build_args}
    bash = shutil.which("bash")
    assert bash, "bash is needed to expand the FROM line"
    proc = subprocess.run([bash, "-c", f'printf %s "{line}"'], env=env, capture_output=True, text=True, check=True)
    return proc.stdout


def test_dockerfile_base_image_can_be_pinned_by_digest() -> None:
    text = (ROOT / "Dockerfile").read_text()
    assert re.search(r"^ARG BASE_IMAGE=python:3\.11-slim$", text, re.M)
    assert text.index("ARG BASE_DIGEST") < text.index("\nFROM ")  # an ARG before FROM is what FROM can use
    assert _dockerfile_from(text, {}) == "python:3.11-slim"
    digest = "sha256:" + "0123456789abcdef" * 4
    assert _dockerfile_from(text, {"BASE_DIGEST": digest}) == f"python:3.11-slim@{digest}"


def test_dockerfile() -> None:
    text = (ROOT / "Dockerfile").read_text()
    assert len(re.findall(r"^FROM ", text, re.M)) == 1
    users = re.findall(r"^USER\s+(\S+)", text, re.M)
    assert users and users[-1] not in ("root", "0", "0:0"), "the image must end as a non-root user"
    assert re.search(r'^ENTRYPOINT \["pdexporter"\]', text, re.M)
    assert re.search(rf"^EXPOSE {DEFAULT_PORT}\b", text, re.M)
    assert str(defaults()["podSecurityContext"]["runAsUser"]) in text  # the chart's uid is the image's
    ignored = (ROOT / ".dockerignore").read_text().split()
    for entry in (".git", "results", "tests", "helm"):
        assert any(line.strip("/*") == entry for line in ignored), entry
