"""`helm lint` and `helm template` for values.yaml and every ci/*-values.yaml, output checked by kubernetes-validate.

Runs with every Helm engine present (tests/integration/helm/helm_engines.py): the `helm` binary if on
PATH, and Helm's Go SDK through helm-python-sdk. With neither, the tests skip and say why; the schema
and static checks in tests/unit/helm run regardless.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from pdexporter.sweep.spec import load_sweep
from tests.integration.helm.helm_engines import HelmEngine, HelmGoSdk, available_engines, manifests
from tests.unit.helm.chart import CHART, ROOT, VALUES_FILES, load_yaml

pytestmark = pytest.mark.integration

KUBERNETES_VERSION = "1.30.0"
RELEASE, NAMESPACE = "pdx", "inference"
ENGINES = available_engines()
NO_ENGINE = ("no helm binary on PATH and helm-python-sdk not installed: helm lint / helm template / "
             "kubernetes-validate did not run (schema and static checks in tests/unit/helm still ran)")
WORKLOAD_KINDS = {"Deployment", "Job", "Pod"}
HARDENED = {"runAsNonRoot": True, "readOnlyRootFilesystem": True, "allowPrivilegeEscalation": False}


def _engine_id(engine: HelmEngine) -> str:
    return engine.name.split(" ")[0] + ("-sdk" if isinstance(engine, HelmGoSdk) else "-binary")


@pytest.fixture(params=ENGINES or [None], ids=[_engine_id(e) for e in ENGINES] or ["none"])
def engine(request: pytest.FixtureRequest) -> HelmEngine:
    if request.param is None:
        pytest.skip(NO_ENGINE)
    return request.param


def render(engine: HelmEngine, values_file: Path | None, chart: Path = CHART) -> list[dict[str, Any]]:
    return manifests(engine.template(chart, values_file, RELEASE, NAMESPACE))


def _values_arg(path: Path) -> Path | None:
    return None if path.name == "values.yaml" else path


def pod_spec(doc: dict[str, Any]) -> dict[str, Any]:
    if doc["kind"] == "Pod":
        return doc["spec"]
    return doc["spec"]["template"]["spec"]


def by_kind(docs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [d for d in docs if d["kind"] == kind]


def check_service_monitor(monitor: dict[str, Any], services: list[dict[str, Any]]) -> None:
    """No offline schema exists for the Prometheus Operator CRD: check what makes it scrape the Service."""
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    selector = monitor["spec"]["selector"]["matchLabels"]
    targets = [s for s in services if selector.items() <= s["metadata"]["labels"].items()]
    assert len(targets) == 1, "the ServiceMonitor must select exactly the exporter's Service"
    ports = {p["name"] for p in targets[0]["spec"]["ports"]}
    for endpoint in monitor["spec"]["endpoints"]:
        assert endpoint["port"] in ports and endpoint["path"] == "/metrics"
    if monitor["metadata"]["namespace"] != NAMESPACE:
        assert monitor["spec"]["namespaceSelector"]["matchNames"] == [NAMESPACE]


@pytest.mark.parametrize("values_file", VALUES_FILES, ids=lambda p: p.name)
def test_lint_template_and_kubernetes_validate(engine: HelmEngine, values_file: Path) -> None:
    assert engine.lint(CHART, _values_arg(values_file)) == []
    docs = render(engine, _values_arg(values_file))
    assert docs
    validated = 0
    for doc in docs:
        if doc["kind"] == "ServiceMonitor":
            check_service_monitor(doc, by_kind(docs, "Service"))
            continue
        kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)  # raises on any schema error
        validated += 1
    assert validated >= 2

    for doc in docs:
        labels = doc["metadata"]["labels"]
        for key in ("app.kubernetes.io/name", "app.kubernetes.io/instance", "app.kubernetes.io/version",
                    "app.kubernetes.io/managed-by", "app.kubernetes.io/part-of", "helm.sh/chart"):
            assert key in labels, f"{doc['kind']} {doc['metadata']['name']}: no {key}"
        assert labels["app.kubernetes.io/instance"] == RELEASE
        assert doc["metadata"].get("namespace") in (NAMESPACE, "monitoring")

    for doc in docs:
        if doc["kind"] not in WORKLOAD_KINDS:
            continue
        spec = pod_spec(doc)
        volumes = {v["name"]: v for v in spec.get("volumes", [])}
        for container in spec["containers"]:
            if container["name"] == "vllm":
                assert container["securityContext"]["allowPrivilegeEscalation"] is False
                continue
            if all(c["name"] != "vllm" for c in spec["containers"]):  # vLLM's image runs as root: no pod-level
                assert spec["securityContext"]["runAsNonRoot"] is True
                assert spec["securityContext"]["seccompProfile"]["type"] == "RuntimeDefault"
            sc = container["securityContext"]
            assert sc["runAsUser"] != 0
            assert HARDENED.items() <= sc.items(), (doc["metadata"]["name"], container["name"], sc)
            assert sc["capabilities"]["drop"] == ["ALL"] and sc["seccompProfile"]["type"] == "RuntimeDefault"
            mounts = {m["mountPath"]: m["name"] for m in container.get("volumeMounts", [])}
            assert "emptyDir" in volumes[mounts["/tmp"]], "a read-only root needs an emptyDir at /tmp"
            if container["name"] in ("exporter", "sweep"):
                assert "/results" in mounts
            overrides = load_yaml(values_file) if values_file.name != "values.yaml" else {}
            if not overrides.get("exporter", {}).get("resources") and container["name"] == "exporter":
                assert "resources" not in container, "resources must stay unset unless the user sets them"

    # every Service selects pods the same render creates (unless the user named their own pods)
    pods = [d["spec"]["template"]["metadata"]["labels"] for d in docs if d["kind"] in ("Deployment",)]
    for service in by_kind(docs, "Service"):
        selector = service["spec"]["selector"]
        if selector == load_yaml(values_file).get("service", {}).get("selector"):
            continue
        assert any(selector.items() <= labels.items() for labels in pods), service["metadata"]["name"]


def _exporter(docs: list[dict[str, Any]]) -> dict[str, Any]:
    containers = [c for d in docs if d["kind"] == "Deployment" for c in pod_spec(d)["containers"]
                  if c["name"] == "exporter"]
    assert len(containers) == 1
    return containers[0]


def _arg(args: list[str], flag: str) -> str:
    return args[args.index(flag) + 1]


def test_default_install_is_one_exporter_beside_a_vllm_service(engine: HelmEngine) -> None:
    docs = render(engine, None)
    assert sorted(d["kind"] for d in docs) == ["Deployment", "Pod", "Service", "ServiceAccount"]
    args = _exporter(docs)["args"]
    assert args[0] == "run"
    assert _arg(args, "--target") == "http://vllm:8000"
    assert _arg(args, "--probe-decode") == "4"
    assert _arg(args, "--inject-every") == "30s" and _arg(args, "--prefill-tokens") == "4096"
    assert _arg(args, "--listen") == "0.0.0.0:18742" and _arg(args, "--chunk-size") == "8192"
    assert _exporter(docs)["image"] == "pdexporter:0.1.0"


def test_embedded_engine_has_no_target_and_no_injection(engine: HelmEngine) -> None:
    args = _exporter(render(engine, CHART / "ci" / "embedded-engine-values.yaml"))["args"]
    assert "--target" not in args and _arg(args, "--inject-every") == "off"
    if isinstance(engine, HelmGoSdk):
        notes = engine.notes(CHART, CHART / "ci" / "embedded-engine-values.yaml", RELEASE, NAMESPACE)
        assert "EMBEDDED engine" in notes and "modelled" in notes


def test_sidecar_puts_the_exporter_in_the_vllm_pod(engine: HelmEngine) -> None:
    docs = render(engine, CHART / "ci" / "sidecar-values.yaml")
    deployments = by_kind(docs, "Deployment")
    assert [d["metadata"]["name"] for d in deployments] == [f"{RELEASE}-pdexporter-vllm"]
    spec = pod_spec(deployments[0])
    vllm, exporter = spec["containers"]
    assert (vllm["name"], exporter["name"]) == ("vllm", "exporter")
    assert _arg(exporter["args"], "--target") == "http://127.0.0.1:8000"
    assert _arg(exporter["args"], "--chunk-size") == "2048"  # the vLLM container's own budget
    assert "--max-num-batched-tokens=2048" in vllm["args"]
    assert "--enable-logging-iteration-details" in vllm["args"]
    assert vllm["resources"]["limits"]["nvidia.com/gpu"] == 1
    assert {v["name"] for v in spec["volumes"]} >= {"dshm", "pdexporter-tmp", "pdexporter-results"}
    service = next(s for s in by_kind(docs, "Service") if s["metadata"]["name"] == f"{RELEASE}-pdexporter")
    assert service["spec"]["selector"]["app.kubernetes.io/component"] == "vllm"


def test_selfcontained_exporter_probes_the_charts_vllm(engine: HelmEngine) -> None:
    docs = render(engine, CHART / "ci" / "selfcontained-values.yaml")
    assert _arg(_exporter(docs)["args"], "--target") == f"http://{RELEASE}-pdexporter-vllm:8000"
    assert _arg(_exporter(docs)["args"], "--chunk-size") == "16384"
    vllm = next(d for d in by_kind(docs, "Deployment") if d["metadata"]["name"].endswith("-vllm"))
    args = pod_spec(vllm)["containers"][0]["args"]
    assert "--max-num-batched-tokens=16384" in args and "--max-model-len=200000" in args
    assert pod_spec(vllm)["containers"][0]["resources"] == {"limits": {"nvidia.com/gpu": 1},
                                                            "requests": {"cpu": "8", "memory": "64Gi"}}


def test_dashboards_configmaps_carry_the_committed_json(engine: HelmEngine) -> None:
    docs = render(engine, CHART / "ci" / "dashboards-values.yaml")
    maps = by_kind(docs, "ConfigMap")
    assert len(maps) == 2
    shipped: dict[str, str] = {}
    for cm in maps:
        assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
        assert cm["metadata"]["annotations"] == {"grafana_folder": "LLM serving"}
        assert cm["metadata"]["namespace"] == "monitoring"
        shipped.update(cm["data"])
    repo = {p.name: p.read_text() for p in (ROOT / "dashboards").glob("*.json")}
    assert shipped == repo
    assert not by_kind(render(engine, None), "ConfigMap"), "dashboards must be off by default"


def test_service_monitor_off_by_default_and_on_when_asked(engine: HelmEngine) -> None:
    assert not by_kind(render(engine, None), "ServiceMonitor")
    docs = render(engine, CHART / "ci" / "servicemonitor-values.yaml")
    (monitor,) = by_kind(docs, "ServiceMonitor")
    assert monitor["metadata"]["namespace"] == "monitoring"
    assert monitor["metadata"]["labels"]["release"] == "prometheus"
    assert monitor["spec"]["endpoints"][0]["interval"] == "5s"


def test_sweep_job_runs_the_file_from_a_configmap(engine: HelmEngine) -> None:
    values_file = CHART / "ci" / "sweep-values.yaml"
    docs = render(engine, values_file)
    (job,) = by_kind(docs, "Job")
    (cm,) = [d for d in by_kind(docs, "ConfigMap") if d["metadata"]["name"].endswith("-sweep")]
    assert cm["data"]["sweep.yaml"].strip() == load_yaml(values_file)["sweep"]["file"].strip()
    container = pod_spec(job)["containers"][0]
    assert container["args"][:2] == ["sweep", "/etc/pdexporter/sweep.yaml"]
    assert _arg(container["args"], "--target") == "http://vllm.inference.svc.cluster.local:8000"
    assert _arg(container["args"], "--listen") == "0.0.0.0:18742" and _arg(container["args"], "--mode") == "fast"
    volumes = {v["name"]: v for v in pod_spec(job)["volumes"]}
    assert volumes["sweep-file"]["configMap"]["name"] == cm["metadata"]["name"]
    assert volumes["results"]["persistentVolumeClaim"]["claimName"] == "pdexporter-results"
    assert pod_spec(job)["restartPolicy"] == "Never" and job["spec"]["backoffLimit"] == 0
    yaml.safe_load(cm["data"]["sweep.yaml"])  # still YAML after templating

    docs = render(engine, CHART / "ci" / "sweep-existing-configmap-values.yaml")
    (job,) = by_kind(docs, "Job")
    assert {v["name"]: v for v in pod_spec(job)["volumes"]}["sweep-file"]["configMap"]["name"] == "my-sweep"
    assert not by_kind(docs, "ConfigMap") and not by_kind(docs, "Deployment") and not by_kind(docs, "Pod")


def test_helm_test_hook_curls_metrics(engine: HelmEngine) -> None:
    (pod,) = by_kind(render(engine, None), "Pod")
    assert pod["metadata"]["annotations"]["helm.sh/hook"] == "test"
    script = " ".join(pod["spec"]["containers"][0]["args"])
    assert f"http://{RELEASE}-pdexporter:18742/metrics" in script and "curl -fsS" in script
    assert "pdexporter_up" in script


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"exporter": {"mode": "sidecar"}}, "vllm"),
        ({"sweep": {"enabled": True, "file": "reps: 1"}}, "target"),
        ({"exporter": {"probedecode": 3}}, "probedecode"),
    ],
)
def test_bad_values_are_refused_with_a_reason(engine: HelmEngine, tmp_path: Path, overrides: dict[str, Any],
                                              message: str) -> None:
    values_file = tmp_path / "bad-values.yaml"
    values_file.write_text(yaml.safe_dump(overrides))
    with pytest.raises(Exception, match=message):
        engine.template(CHART, values_file, RELEASE, NAMESPACE)


def test_a_parent_chart_can_include_the_sidecar_container(engine: HelmEngine, tmp_path: Path) -> None:
    """Mode `none` + the named template: the documented way to add the exporter to your own vLLM pod."""
    parent = tmp_path / "my-vllm"
    (parent / "templates").mkdir(parents=True)
    shutil.copytree(CHART, parent / "charts" / "pdexporter", ignore=shutil.ignore_patterns("ci"))
    (parent / "Chart.yaml").write_text(
        "apiVersion: v2\nname: my-vllm\nversion: 1.0.0\n"
        "dependencies:\n  - name: pdexporter\n    version: 0.1.0\n"
    )
    (parent / "values.yaml").write_text(
        "pdexporter:\n  exporter:\n    mode: none\n  service:\n    selector:\n      app: my-vllm\n"
        "  vllm:\n    port: 8001\n"
    )
    (parent / "templates" / "deployment.yaml").write_text(
        "apiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: my-vllm\n  labels:\n    app: my-vllm\n"
        "spec:\n  selector:\n    matchLabels:\n      app: my-vllm\n  template:\n    metadata:\n"
        "      labels:\n        app: my-vllm\n    spec:\n      containers:\n"
        "        - name: vllm\n          image: vllm/vllm-openai:v0.22.0\n"
        '        {{- include "pdexporter.sidecarContainer" .Subcharts.pdexporter | nindent 8 }}\n'
        "      volumes:\n"
        '        {{- include "pdexporter.scratchVolumes" .Subcharts.pdexporter | nindent 8 }}\n'
    )
    docs = render(engine, None, chart=parent)
    (deployment,) = by_kind(docs, "Deployment")
    kubernetes_validate.validate(deployment, KUBERNETES_VERSION, strict=True)
    spec = pod_spec(deployment)
    assert [c["name"] for c in spec["containers"]] == ["vllm", "exporter"]
    assert _arg(spec["containers"][1]["args"], "--target") == "http://127.0.0.1:8001"
    (service,) = [s for s in by_kind(docs, "Service") if s["metadata"]["name"].endswith("pdexporter")]
    assert service["spec"]["selector"] == {"app": "my-vllm"}


def _cli_params(command: str, args: list[str]) -> dict[str, Any]:
    """Parse `pdexporter COMMAND ARGS` with the real CLI's option definitions (nothing runs)."""
    import typer.main

    from pdexporter.cli import app

    group = typer.main.get_command(app)
    if command not in group.commands:  # type: ignore[attr-defined]
        pytest.skip(f"`pdexporter {command}` is not on this branch yet: the chart's {command} arguments are unchecked")
    sub = group.commands[command]  # type: ignore[attr-defined]
    return sub.make_context(command, list(args)).params


@pytest.mark.parametrize("values_file", VALUES_FILES, ids=lambda p: p.name)
def test_exporter_arguments_are_accepted_by_pdexporter_run(engine: HelmEngine, values_file: Path) -> None:
    """The chart's container args parse with `pdexporter run` and pass its own option checks."""
    from pdexporter.cli.run import parse_run_options

    containers = [c for d in render(engine, _values_arg(values_file)) if d["kind"] in WORKLOAD_KINDS
                  for c in pod_spec(d)["containers"] if c["name"] == "exporter"]
    for container in containers:
        assert container["args"][0] == "run"
        params = _cli_params("run", container["args"][1:])
        params.pop("api_key_file", None)
        config = parse_run_options(**params)
        assert config is not None


def test_sweep_arguments_are_accepted_by_pdexporter_sweep(engine: HelmEngine, tmp_path: Path) -> None:
    (job,) = by_kind(render(engine, CHART / "ci" / "sweep-values.yaml"), "Job")
    args = pod_spec(job)["containers"][0]["args"]
    assert args[0] == "sweep"
    _cli_params("sweep", args[1:])
    # the sweep file the chart mounts is one `pdexporter sweep` accepts, with the Job's --target
    (config_map,) = [m for m in by_kind(render(engine, CHART / "ci" / "sweep-values.yaml"), "ConfigMap")
                     if "sweep.yaml" in m.get("data", {})]
    sweep_file = tmp_path / "sweep.yaml"
    sweep_file.write_text(config_map["data"]["sweep.yaml"])
    target = args[args.index("--target") + 1]
    spec = load_sweep(sweep_file, {"launcher": {"kind": "external", "url": target, "chunk_size": None}})
    assert spec.launcher.chunk_size == 8192
