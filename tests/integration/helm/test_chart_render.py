"""`helm lint` and `helm template` for values.yaml and every ci/*-values.yaml, output checked by kubernetes-validate.

Runs with every Helm engine present (tests/integration/helm/helm_engines.py): the `helm` binary if on
PATH, and Helm's Go SDK through helm-python-sdk. With neither, the tests skip and say why; the schema
and static checks in tests/unit/helm run regardless.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from pdexporter.sweep.spec import load_sweep
from tests.integration.helm.helm_engines import HelmEngine, HelmGoSdk, available_engines, manifests
from tests.unit.helm.chart import CHART, ROOT, VALUES_FILES, load_yaml
from tests.unit.helm.test_values_schema import quantity

pytestmark = pytest.mark.integration

KUBERNETES_VERSION = "1.30.0"
RELEASE, NAMESPACE = "pdx", "inference"
ENGINES = available_engines()
NO_ENGINE = ("no helm binary on PATH and helm-python-sdk not installed: helm lint / helm template / "
             "kubernetes-validate did not run (schema and static checks in tests/unit/helm still ran)")
WORKLOAD_KINDS = {"Deployment", "Job", "Pod"}
HARDENED = {"runAsNonRoot": True, "readOnlyRootFilesystem": True, "allowPrivilegeEscalation": False,
            "privileged": False}
IMAGE_REF = re.compile(r"^[a-z0-9./_-]+(:[A-Za-z0-9._-]+|@sha256:[a-f0-9]{64})$")
INDEX = "$(JOB_COMPLETION_INDEX)"


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
        assert spec["securityContext"]["runAsNonRoot"] is True and spec["securityContext"]["runAsUser"] != 0
        assert spec["securityContext"]["seccompProfile"]["type"] == "RuntimeDefault"
        for container in spec["containers"]:
            where = (doc["metadata"]["name"], container["name"])
            assert IMAGE_REF.match(container["image"]), (where, container["image"])
            sc = container["securityContext"]
            assert sc.get("runAsUser", spec["securityContext"]["runAsUser"]) != 0, where
            assert HARDENED.items() <= sc.items(), (where, sc)
            assert sc["capabilities"]["drop"] == ["ALL"] and sc["seccompProfile"]["type"] == "RuntimeDefault"
            mounts = {m["mountPath"]: m["name"] for m in container.get("volumeMounts", [])}
            tmp = volumes[mounts["/tmp"]]
            assert "emptyDir" in tmp or "persistentVolumeClaim" in tmp, "a read-only root needs a volume at /tmp"
            if container["name"] in ("exporter", "sweep"):
                assert "/results" in mounts
            if container["name"] == "vllm":
                env = {e["name"]: e for e in container["env"]}
                assert env["HOME"]["value"] in mounts, "vLLM's HOME must be a writable volume"
                assert f"{env['HOME']['value']}/.cache" in mounts
                for name in ("TRITON_CACHE_DIR", "TORCHINDUCTOR_CACHE_DIR"):
                    assert env[name]["value"] in mounts, name
                assert "nvidia.com/gpu" in container["resources"]["limits"]
                continue
            resources = container["resources"]  # sized by default: requests and limits, requests <= limits
            for kind in ("cpu", "memory"):
                request, limit = resources["requests"][kind], resources["limits"][kind]
                assert quantity(request) <= quantity(limit), (where, kind, request, limit)

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
    assert sorted(d["kind"] for d in docs) == ["Deployment", "NetworkPolicy", "Pod", "Service", "ServiceAccount"]
    args = _exporter(docs)["args"]
    assert args[0] == "run"
    assert _arg(args, "--target") == "http://vllm:8000"
    assert _arg(args, "--decode-batch-size") == "4"
    # issue 24: the chart injected 4096-token prefills every 30 s into http://vllm:8000 by default,
    # where the CLI makes injection against a real engine opt-in; no trace receiver without passive
    assert _arg(args, "--inject-every") == "off" and _arg(args, "--new-prefill-tokens") == "4096"
    assert "--traces-listen" not in args and [p["name"] for p in _exporter(docs)["ports"]] == ["metrics"]
    assert "--probe-decode" not in args and "--prefill-tokens" not in args  # the old names: no warning in the log
    assert _arg(args, "--listen") == "0.0.0.0:18742" and _arg(args, "--chunk-size") == "8192"
    assert "--passive" not in args
    assert _exporter(docs)["image"] == "pdexporter:0.1.0"
    # SIGTERM: the window in flight (<= 30 s) and the span flush (<= 5 s) before Kubernetes kills it
    assert pod_spec(by_kind(docs, "Deployment")[0])["terminationGracePeriodSeconds"] == 45


def _probe_paths(container: dict[str, Any]) -> tuple[str, str]:
    return container["livenessProbe"]["httpGet"]["path"], container["readinessProbe"]["httpGet"]["path"]


def test_exporter_liveness_and_readiness_probe_the_health_endpoints(engine: HelmEngine) -> None:
    """Liveness on /livez (never the engine's state), readiness on /readyz, in both pod forms."""
    assert _probe_paths(_exporter(render(engine, None))) == ("/livez", "/readyz")
    docs = render(engine, CHART / "ci" / "sidecar-values.yaml")
    (sidecar,) = [c for c in pod_spec(by_kind(docs, "Deployment")[0])["containers"] if c["name"] == "exporter"]
    assert _probe_paths(sidecar) == ("/livez", "/readyz")
    for container in (_exporter(render(engine, None)), sidecar):
        assert container["livenessProbe"]["httpGet"]["port"] == "metrics"
        assert any(p["name"] == "metrics" for p in container["ports"])


def test_default_resources_on_every_pdexporter_container(engine: HelmEngine, tmp_path: Path) -> None:
    docs = render(engine, CHART / "ci" / "sweep-values.yaml")
    expected = {
        "exporter": {"requests": {"cpu": "100m", "memory": "256Mi"}, "limits": {"cpu": "1", "memory": "512Mi"}},
        "sweep": {"requests": {"cpu": "250m", "memory": "256Mi"}, "limits": {"cpu": "2", "memory": "1Gi"}},
        "curl-metrics": {"requests": {"cpu": "10m", "memory": "16Mi"}, "limits": {"cpu": "100m", "memory": "64Mi"}},
    }
    seen = {c["name"]: c["resources"] for d in docs if d["kind"] in WORKLOAD_KINDS for c in pod_spec(d)["containers"]}
    assert seen == expected
    # a user's value merges into the defaults; null removes one
    values = tmp_path / "values.yaml"
    values.write_text(
        yaml.safe_dump({"exporter": {"resources": {"requests": {"cpu": "200m"}, "limits": {"cpu": None}}}})
    )
    assert _exporter(render(engine, values))["resources"] == {"requests": {"cpu": "200m", "memory": "256Mi"},
                                                              "limits": {"memory": "512Mi"}}


def _values(tmp_path: Path, values: dict[str, Any], name: str = "values.yaml") -> Path:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(values))
    return path


def test_image_digests_pin_every_image(engine: HelmEngine, tmp_path: Path) -> None:
    digest = {
        name: "sha256:" + (hex_digit * 64) for name, hex_digit in (("exporter", "a"), ("vllm", "b"), ("test", "c"))
    }
    values = _values(tmp_path, {
        "image": {"repository": "registry.example.com/pdexporter", "tag": "0.1.0", "digest": digest["exporter"]},
        "tests": {"image": {"digest": digest["test"]}},
        "vllm": {"enabled": True, "image": {"digest": digest["vllm"]}},
        "exporter": {"mode": "sidecar"},
        "sweep": {"enabled": True, "target": "http://vllm:8000", "file": "grid: {chunk_sizes: [8192]}"},
    })
    images = {c["name"]: c["image"] for d in render(engine, values) if d["kind"] in WORKLOAD_KINDS
              for c in pod_spec(d)["containers"]}
    assert images == {
        "vllm": f"vllm/vllm-openai@{digest['vllm']}",
        "exporter": f"registry.example.com/pdexporter@{digest['exporter']}",
        "sweep": f"registry.example.com/pdexporter@{digest['exporter']}",
        "curl-metrics": f"curlimages/curl@{digest['test']}",
    }
    # without digests: tags
    images = {c["name"]: c["image"] for d in render(engine, CHART / "ci" / "sidecar-values.yaml")
              if d["kind"] in WORKLOAD_KINDS for c in pod_spec(d)["containers"]}
    assert images == {"vllm": "vllm/vllm-openai:v0.22.0", "exporter": "pdexporter:0.1.0",
                      "curl-metrics": "curlimages/curl:8.11.1"}
    (exporter_image,) = {_exporter(render(engine, CHART / "ci" / "deployment-values.yaml"))["image"]}
    assert re.fullmatch(r"registry\.example\.com/pdexporter@sha256:[a-f0-9]{64}", exporter_image)


def test_exporter_values_keep_their_old_names_for_one_release(engine: HelmEngine, tmp_path: Path) -> None:
    """exporter.probeDecode / prefillTokens (the names before the one vocabulary) still set D and P,
    as --decode-batch-size / --new-prefill-tokens, and NOTES.txt says what they are now called."""
    new = _exporter(render(engine, _values(tmp_path, {"exporter": {"decodeBatchSize": 6, "newPrefillTokens": 2048}})))
    assert _arg(new["args"], "--decode-batch-size") == "6" and _arg(new["args"], "--new-prefill-tokens") == "2048"
    values = _values(
        tmp_path, {"exporter": {"probeDecode": 7, "prefillTokens": 1024, "injectEvery": "30s"}}, "old.yaml"
    )
    args = _exporter(render(engine, values))["args"]
    assert _arg(args, "--decode-batch-size") == "7" and _arg(args, "--new-prefill-tokens") == "1024"
    assert "--probe-decode" not in args and "--prefill-tokens" not in args
    if isinstance(engine, HelmGoSdk):
        notes = engine.notes(CHART, values, RELEASE, NAMESPACE)
        assert "WARNING: exporter.probeDecode is now exporter.decodeBatchSize" in notes
        assert "WARNING: exporter.prefillTokens is now exporter.newPrefillTokens" in notes
        assert "with 7 decode probe streams" in notes and "1024-token prefill" in notes
        assert "WARNING: exporter." not in engine.notes(CHART, None, RELEASE, NAMESPACE)


def test_embedded_engine_has_no_target_and_no_injection(engine: HelmEngine) -> None:
    args = _exporter(render(engine, CHART / "ci" / "embedded-engine-values.yaml"))["args"]
    assert "--target" not in args and _arg(args, "--inject-every") == "off"
    if isinstance(engine, HelmGoSdk):
        notes = engine.notes(CHART, CHART / "ci" / "embedded-engine-values.yaml", RELEASE, NAMESPACE)
        assert "EMBEDDED engine" in notes and "modelled" in notes


@pytest.mark.parametrize("where", ["vllm", "tests"])
def test_an_image_without_tag_or_digest_is_refused(engine: HelmEngine, tmp_path: Path, where: str) -> None:
    values = _values(tmp_path, {where: {"enabled": True, "image": {"tag": ""}}, "exporter": {"mode": "none"}})
    with pytest.raises(Exception, match=rf"{where}\.image: set {where}\.image\.tag or {where}\.image\.digest"):
        engine.template(CHART, values, RELEASE, NAMESPACE)


def test_passive_mode_passes_passive_and_no_injection(engine: HelmEngine) -> None:
    docs = render(engine, CHART / "ci" / "passive-values.yaml")
    exporter = _exporter(docs)
    args = exporter["args"]
    assert "--passive" in args and "--inject-every" not in args
    # the trace receiver: its own port, in the container and the Service, behind its token
    assert _arg(args, "--traces-listen") == "0.0.0.0:18743"
    assert {p["name"]: p["containerPort"] for p in exporter["ports"]} == {"metrics": 18742, "traces": 18743}
    (service,) = by_kind(docs, "Service")
    assert {p["name"]: p["port"] for p in service["spec"]["ports"]} == {"metrics": 18742, "traces": 18743}
    assert _secret_ref(_env(exporter), "PDEXPORTER_TRACES_TOKEN") == {"name": "vllm-otlp-token", "key": "token"}
    assert _arg(args, "--target") == "http://vllm.inference.svc.cluster.local:8000"
    # the live router thresholds: the two-arm decision.json from its ConfigMap, read-only
    assert _arg(args, "--decision") == "/etc/pdexporter/decision/decision.json"
    assert _arg(args, "--threshold-every") == "2m"
    mount = next(v for v in exporter["volumeMounts"] if v["name"] == "pdexporter-decision")
    assert mount == {"name": "pdexporter-decision", "mountPath": "/etc/pdexporter/decision", "readOnly": True}
    deployment = next(d for d in by_kind(docs, "Deployment")
                      if any(c["name"] == "exporter" for c in pod_spec(d)["containers"]))
    volume = next(v for v in pod_spec(deployment)["volumes"] if v["name"] == "pdexporter-decision")
    assert volume["configMap"] == {"name": "pdx-decision"}
    if isinstance(engine, HelmGoSdk):
        notes = engine.notes(CHART, CHART / "ci" / "passive-values.yaml", RELEASE, NAMESPACE)
        assert "passive mode" in notes
        assert f"--otlp-traces-endpoint http://{RELEASE}-pdexporter.{NAMESPACE}.svc:18743/v1/traces" in notes


@pytest.mark.parametrize(("exporter", "message"), [
    ({"liveThresholds": {"enabled": True, "decisionConfigMap": {"name": "d", "key": "decision.json"}}},
     r"exporter\.liveThresholds\.enabled=true .*set exporter\.passive=true"),
    ({"passive": True, "liveThresholds": {"enabled": True}},
     r"exporter\.liveThresholds\.enabled=true needs exporter\.liveThresholds\.decisionConfigMap\.name"),
])
def test_live_thresholds_need_passive_and_a_decision(engine: HelmEngine, tmp_path: Path, exporter: dict[str, Any],
                                                     message: str) -> None:
    values = _values(tmp_path, {"exporter": {"injectEvery": "", **exporter}})
    with pytest.raises(Exception, match=message):
        engine.template(CHART, values, RELEASE, NAMESPACE)


def _chart_without_schema(tmp_path: Path) -> Path:
    """The chart minus values.schema.json: what `helm install --skip-schema-validation` renders."""
    chart = tmp_path / "chart"
    shutil.copytree(CHART, chart, ignore=shutil.ignore_patterns("ci", "values.schema.json"))
    return chart


@pytest.mark.parametrize("schema", [True, False], ids=["schema", "template"])
def test_passive_with_injection_is_refused(engine: HelmEngine, tmp_path: Path, schema: bool) -> None:
    """Refused by the schema, and by the template when the schema is skipped."""
    chart = CHART if schema else _chart_without_schema(tmp_path)
    values = _values(tmp_path, {"exporter": {"passive": True, "injectEvery": "10s"}})
    with pytest.raises(Exception, match="injectEvery" if schema else r"exporter\.passive=true .*injectEvery=10s"):
        engine.template(chart, values, RELEASE, NAMESPACE)


def _env(container: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {e["name"]: e for e in container.get("env", [])}


def test_vllm_runs_as_non_root_with_a_read_only_root(engine: HelmEngine) -> None:
    docs = render(engine, CHART / "ci" / "sidecar-values.yaml")
    spec = pod_spec(by_kind(docs, "Deployment")[0])
    vllm = spec["containers"][0]
    assert spec["securityContext"]["runAsUser"] == 2000 and "runAsUser" not in vllm["securityContext"]
    assert vllm["securityContext"]["readOnlyRootFilesystem"] is True
    mounts = [m["mountPath"] for m in vllm["volumeMounts"]]
    assert mounts.index("/home/vllm") < mounts.index("/home/vllm/.cache"), "a parent is mounted before its child"
    volumes = {v["name"]: v for v in spec["volumes"]}
    by_path = {m["mountPath"]: volumes[m["name"]] for m in vllm["volumeMounts"]}
    assert by_path["/home/vllm/.cache"]["emptyDir"] == {"sizeLimit": "200Gi"}
    assert by_path["/tmp"]["emptyDir"] == {"sizeLimit": "8Gi"}
    env = _env(vllm)
    assert env["HOME"]["value"] == "/home/vllm" and env["USER"]["value"] == "vllm"
    assert env["TRITON_CACHE_DIR"]["value"] == "/var/cache/triton"
    assert env["TORCHINDUCTOR_CACHE_DIR"]["value"] == "/var/cache/torchinductor"
    # the sidecar keeps its own uid inside vLLM's pod
    exporter = spec["containers"][1]
    assert exporter["securityContext"]["runAsUser"] == 10001
    # a writable dir on a PVC (selfcontained keeps the weights)
    docs = render(engine, CHART / "ci" / "selfcontained-values.yaml")
    vllm_deployment = next(d for d in by_kind(docs, "Deployment") if d["metadata"]["name"].endswith("-vllm"))
    volumes = {v["name"]: v for v in pod_spec(vllm_deployment)["volumes"]}
    assert volumes["vllm-cache"] == {"name": "vllm-cache", "persistentVolumeClaim": {"claimName": "vllm-cache"}}


def test_writable_dirs_with_one_mount_path_are_refused(engine: HelmEngine, tmp_path: Path) -> None:
    values = _values(tmp_path, {"vllm": {"enabled": True, "writableDirs": {"scratch": {"mountPath": "/tmp"}}}})
    with pytest.raises(Exception, match=r"vllm\.writableDirs\.\w+: mountPath /tmp is also"):
        engine.template(CHART, values, RELEASE, NAMESPACE)


def _secret_ref(env: dict[str, dict[str, Any]], name: str) -> dict[str, str]:
    return env[name]["valueFrom"]["secretKeyRef"]


def test_vllm_api_key_reaches_vllm_exporter_and_sweep(engine: HelmEngine, tmp_path: Path) -> None:
    docs = render(engine, CHART / "ci" / "selfcontained-values.yaml")
    vllm_deployment = next(d for d in by_kind(docs, "Deployment") if d["metadata"]["name"].endswith("-vllm"))
    vllm = pod_spec(vllm_deployment)["containers"][0]
    secret = {"name": "vllm-api-key", "key": "api-key"}
    assert _secret_ref(_env(vllm), "VLLM_API_KEY") == secret
    assert not any("api-key" in a or "vllm-api-key" in a for a in vllm["args"]), "the key is never an argument"
    assert _secret_ref(_env(_exporter(docs)), "PDEXPORTER_API_KEY") == secret

    values = {"vllm": {"enabled": True, "apiKeySecret": {"name": "k", "key": "token"}}, "exporter": {"mode": "sidecar"},
              "sweep": {"enabled": True, "target": "http://vllm:8000", "file": "grid: {chunk_sizes: [8192]}"}}
    docs = render(engine, _values(tmp_path, values))
    containers = {c["name"]: c for d in docs if d["kind"] in WORKLOAD_KINDS for c in pod_spec(d)["containers"]}
    assert _secret_ref(_env(containers["vllm"]), "VLLM_API_KEY") == {"name": "k", "key": "token"}
    for name in ("exporter", "sweep"):
        assert _secret_ref(_env(containers[name]), "PDEXPORTER_API_KEY") == {"name": "k", "key": "token"}, name
    assert "PDEXPORTER_API_KEY" not in _env(containers["curl-metrics"])

    # exporter.apiKeySecret names another Secret: it wins for the exporter
    values["exporter"]["apiKeySecret"] = {"name": "exporter-key", "key": "t"}
    docs = render(engine, _values(tmp_path, values))
    (exporter,) = [c for d in by_kind(docs, "Deployment") for c in pod_spec(d)["containers"] if c["name"] == "exporter"]
    assert _secret_ref(_env(exporter), "PDEXPORTER_API_KEY") == {"name": "exporter-key", "key": "t"}
    # no Secret anywhere: no key variable anywhere
    for doc in render(engine, None):
        if doc["kind"] in WORKLOAD_KINDS:
            for container in pod_spec(doc)["containers"]:
                assert not {"PDEXPORTER_API_KEY", "VLLM_API_KEY"} & set(_env(container))


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


def test_the_exporter_is_told_the_command_line_of_the_charts_vllm(engine: HelmEngine, tmp_path: Path) -> None:
    """Where the chart renders vLLM itself, the exporter gets that vLLM's command line (`--engine-command`): its
    records then carry it, redacted, and the fit reads the engine's CUDA-graph sizes from it (a JSON
    --compilation-config in vllm.extraArgs stays one word). Without vllm.enabled the engine is someone else's."""
    import shlex

    from pdexporter.engines.vllm import graph_max_tokens_of

    sizes = {"cudagraph_capture_sizes": [1, 2, 4, 8, 16, 512, 528, 1040, 2064]}
    selfcontained = load_yaml(CHART / "ci" / "selfcontained-values.yaml")
    selfcontained["vllm"]["extraArgs"] = ["--compilation-config", json.dumps(sizes)]
    docs = render(engine, _values(tmp_path, selfcontained))
    vllm = next(d for d in by_kind(docs, "Deployment") if d["metadata"]["name"].endswith("-vllm"))
    words = shlex.split(_arg(_exporter(docs)["args"], "--engine-command"))
    assert words == ["vllm", "serve", *pod_spec(vllm)["containers"][0]["args"]]
    assert graph_max_tokens_of(words, 16384) == 2064
    sidecar = pod_spec(by_kind(render(engine, CHART / "ci" / "sidecar-values.yaml"), "Deployment")[0])["containers"]
    assert shlex.split(_arg(sidecar[1]["args"], "--engine-command"))[2:] == sidecar[0]["args"]
    assert "--engine-command" not in _exporter(render(engine, CHART / "values.yaml"))["args"]


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
    assert job["spec"]["completionMode"] == "Indexed" and job["spec"]["completions"] == 1  # grid: [8192]
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
        ({"sweep": {"enabled": True, "file": "reps: 1"}}, r"sweep\.file: grid\.chunk_sizes is missing or empty"),
        ({"sweep": {"enabled": True, "file": "grid: {chunk_sizes: []}"}}, r"grid\.chunk_sizes is missing or empty"),
        (
            {"sweep": {"enabled": True, "file": "grid: {chunk_sizes: [big]}"}},
            r"grid\.chunk_sizes has big, not a number",
        ),
        ({"sweep": {"enabled": True, "file": "- a list\n- not a mapping"}}, r"sweep\.file is not a YAML mapping"),
        (
            {"sweep": {"enabled": True, "file": "grid: {chunk_sizes: [2048, 8192]}", "chunkSizes": [8192, 2048]}},
            r"sweep\.chunkSizes \[8192,2048\] does not match sweep\.file's grid\.chunk_sizes \[2048,8192\]",
        ),
        (
            {"sweep": {"enabled": True, "file": "grid: {chunk_sizes: [2048, 8192]}", "target": "http://vllm:8000"}},
            r"sweep\.target=http://vllm:8000 is one engine with one chunk size, but the sweep has 2 chunk sizes",
        ),
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
    missing = None
    for container in containers:
        args = container["args"]
        assert args[0] == "run"
        missing = _check_cli_params("run", args[1:], {"--passive": 0}) or missing
        if missing:
            args = [a for a in args if a != "--passive"]
        params = _cli_params("run", args[1:])
        for secret in ("api_key_file", "metrics_token_file", "traces_token_file"):  # read from files by run()
            params.pop(secret, None)
        config = parse_run_options(**params)
        assert config is not None
    if missing:
        pytest.skip(f"`pdexporter run` has no {missing} on this branch (another developer adds it): "
                    "the other arguments parsed and passed run's checks")


def test_existing_configmap_without_chunk_sizes_is_refused_by_the_template(engine: HelmEngine, tmp_path: Path) -> None:
    values = _values(tmp_path, {"sweep": {"enabled": True, "existingConfigMap": "my-sweep"}})
    with pytest.raises(Exception, match=r"sweep\.existingConfigMap=my-sweep: .*sweep\.chunkSizes must list"):
        engine.template(_chart_without_schema(tmp_path), values, RELEASE, NAMESPACE)


def _sweep_file(chunk_sizes: list[int]) -> str:
    return yaml.safe_dump({
        "name": "indexed", "grid": {"chunk_sizes": chunk_sizes, "decode_batch_sizes": [0, 2],
                                    "new_prefill_tokens": [512]},
        "reps": 1, "launcher": {"kind": "sim", "profile": "h200-qwen3-coder-30b-a3b", "clock": "virtual"},
    }, sort_keys=False)


def _index_args(job: dict[str, Any], index: int) -> list[str]:
    """The sweep container's args for completion `index`, as the kubelet expands $(JOB_COMPLETION_INDEX)."""
    (container,) = pod_spec(job)["containers"]
    (env,) = [e for e in container["env"] if e["name"] == "JOB_COMPLETION_INDEX"]
    assert (
        env["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.annotations['batch.kubernetes.io/job-completion-index']"
    )
    return [a.replace(INDEX, str(index)) for a in container["args"]]


@pytest.mark.parametrize("chunk_sizes", [[8192], [2048, 8192], [1024, 2048, 4096, 8192, 16384]],
                         ids=lambda sizes: f"{len(sizes)}-chunk-sizes")
def test_indexed_sweep_job_has_one_completion_per_chunk_size(engine: HelmEngine, tmp_path: Path,
                                                            chunk_sizes: list[int]) -> None:
    """No target: the sweep file's launcher starts each chunk size's engine; pod I runs the I-th."""
    values = _values(tmp_path, {"sweep": {"enabled": True, "file": _sweep_file(chunk_sizes), "parallelism": 2,
                                          "resultsClaim": "results"}})
    docs = render(engine, values)
    (job,) = by_kind(docs, "Job")
    kubernetes_validate.validate(job, KUBERNETES_VERSION, strict=True)
    assert job["spec"]["completionMode"] == "Indexed"
    assert job["spec"]["completions"] == len(chunk_sizes) and job["spec"]["parallelism"] == 2
    assert yaml.safe_load(job["metadata"]["annotations"]["pdexporter/chunk-sizes"]) == chunk_sizes
    for index in range(len(chunk_sizes)):
        args = _index_args(job, index)
        assert args[:2] == ["sweep", "/etc/pdexporter/sweep.yaml"]
        assert _arg(args, "--chunk-index") == str(index)
        assert _arg(args, "--out") == f"/results/chunk-{index}"
        assert "--target" not in args
    mounts = {m["mountPath"]: m["name"] for m in pod_spec(job)["containers"][0]["volumeMounts"]}
    volumes = {v["name"]: v for v in pod_spec(job)["volumes"]}
    assert volumes[mounts["/results"]]["persistentVolumeClaim"]["claimName"] == "results"
    if isinstance(engine, HelmGoSdk):
        notes = engine.notes(CHART, values, RELEASE, NAMESPACE)
        joined = " ".join(f"/results/chunk-{i}" for i in range(len(chunk_sizes)))
        assert f"pdexporter export-table {joined}\n" in notes
        for index, size in enumerate(chunk_sizes):
            assert f"index {index}: chunk size {size} -> /results/chunk-{index}" in notes
        assert "WARNING" not in notes


def test_indexed_sweep_example_one_engine_per_chunk_size(engine: HelmEngine) -> None:
    values_file = CHART / "ci" / "sweep-indexed-values.yaml"
    (job,) = by_kind(render(engine, values_file), "Job")
    given = load_yaml(values_file)["sweep"]
    assert job["spec"]["completions"] == len(given["chunkSizes"]) == 4 and job["spec"]["parallelism"] == 2
    for index in range(4):
        args = _index_args(job, index)
        assert _arg(args, "--target") == f"http://vllm-b{index}.inference.svc.cluster.local:8000"
        assert _arg(args, "--chunk-index") == str(index) and _arg(args, "--out") == f"/results/chunk-{index}"
    assert yaml.safe_load(given["file"])["grid"]["chunk_sizes"] == given["chunkSizes"]


def test_sweep_results_on_an_emptydir_are_flagged(engine: HelmEngine, tmp_path: Path) -> None:
    values = _values(tmp_path, {"sweep": {"enabled": True, "file": _sweep_file([2048, 4096])}})
    (job,) = by_kind(render(engine, values), "Job")
    volumes = {v["name"]: v for v in pod_spec(job)["volumes"]}
    assert volumes["results"] == {"name": "results", "emptyDir": {}}
    if isinstance(engine, HelmGoSdk):
        assert "WARNING: sweep.resultsClaim is empty" in engine.notes(CHART, values, RELEASE, NAMESPACE)


def _check_cli_params(command: str, args: list[str], pending: dict[str, int]) -> str | None:
    """Parse ARGS with the real `pdexporter COMMAND`. Flags another developer is adding
    (`pending`: flag -> number of values) are taken out when this branch's CLI lacks them; the
    rest must still parse. Returns the flags taken out, for a skip that names them."""
    import typer.main

    from pdexporter.cli import app

    sub = typer.main.get_command(app).commands[command]  # type: ignore[attr-defined]
    known = {opt for param in sub.params for opt in param.opts}
    missing = [flag for flag in pending if flag in args and flag not in known]
    for flag in missing:
        at = args.index(flag)
        args = args[:at] + args[at + 1 + pending[flag]:]
    sub.make_context(command, list(args))
    return ", ".join(missing) or None


def test_sweep_arguments_are_accepted_by_pdexporter_sweep(engine: HelmEngine, tmp_path: Path) -> None:
    missing = None
    for values_file in ("sweep-values.yaml", "sweep-indexed-values.yaml", "sweep-existing-configmap-values.yaml"):
        (job,) = by_kind(render(engine, CHART / "ci" / values_file), "Job")
        for index in range(job["spec"]["completions"]):
            args = _index_args(job, index)
            assert args[0] == "sweep"
            missing = _check_cli_params("sweep", args[1:], {"--chunk-index": 1}) or missing
    if missing:
        pytest.skip(f"`pdexporter sweep` has no {missing} on this branch (another developer adds it): "
                    "the Job's other arguments parsed; that flag is checked once it exists")


def test_sweep_file_is_accepted_by_pdexporter_sweep(engine: HelmEngine, tmp_path: Path) -> None:
    (job,) = by_kind(render(engine, CHART / "ci" / "sweep-values.yaml"), "Job")
    args = pod_spec(job)["containers"][0]["args"]
    # the sweep file the chart mounts is one `pdexporter sweep` accepts, with the Job's --target
    (config_map,) = [m for m in by_kind(render(engine, CHART / "ci" / "sweep-values.yaml"), "ConfigMap")
                     if "sweep.yaml" in m.get("data", {})]
    sweep_file = tmp_path / "sweep.yaml"
    sweep_file.write_text(config_map["data"]["sweep.yaml"])
    target = args[args.index("--target") + 1]
    spec = load_sweep(sweep_file, {"launcher": {"kind": "external", "url": target, "chunk_size": None}})
    assert spec.launcher.chunk_size == 8192


def test_indexed_sweep_file_is_accepted_chunk_by_chunk(engine: HelmEngine, tmp_path: Path) -> None:
    """Each completion's engine has one chunk size: the mounted file, narrowed to the I-th chunk size
    (what `--chunk-index I` selects), is accepted with completion I's --target as its external engine."""
    docs = render(engine, CHART / "ci" / "sweep-indexed-values.yaml")
    (job,) = by_kind(docs, "Job")
    (config_map,) = [m for m in by_kind(docs, "ConfigMap") if "sweep.yaml" in m.get("data", {})]
    grid = yaml.safe_load(config_map["data"]["sweep.yaml"])["grid"]
    for index, chunk_size in enumerate(grid["chunk_sizes"]):
        target = _arg(_index_args(job, index), "--target")
        narrowed = yaml.safe_load(config_map["data"]["sweep.yaml"])
        narrowed["grid"]["chunk_sizes"] = [chunk_size]
        sweep_file = tmp_path / f"sweep-{index}.yaml"
        sweep_file.write_text(yaml.safe_dump(narrowed))
        spec = load_sweep(sweep_file, {"launcher": {"kind": "external", "url": target, "chunk_size": None}})
        assert (spec.launcher.chunk_size, spec.launcher.url) == (chunk_size, target)


# --- NetworkPolicy -----------------------------------------------------------------------------


def _rules(
    policy: dict[str, Any], direction: str
) -> list[tuple[frozenset[tuple[int, str]], list[dict[str, Any]] | None]]:
    """Each rule as (its (port, protocol) set, its peers or None for any peer)."""
    key = "from" if direction == "ingress" else "to"
    return [(frozenset((p["port"], p["protocol"]) for p in rule["ports"]), rule.get(key))
            for rule in policy["spec"][direction]]


def _policy(docs: list[dict[str, Any]]) -> dict[str, Any]:
    (policy,) = by_kind(docs, "NetworkPolicy")
    kubernetes_validate.validate(policy, KUBERNETES_VERSION, strict=True)
    return policy


def _selects(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    return selector["matchLabels"].items() <= labels.items()


def test_network_policy_default_metrics_in_dns_and_engine_out(engine: HelmEngine) -> None:
    docs = render(engine, None)
    policy = _policy(docs)
    assert sorted(policy["spec"]["policyTypes"]) == ["Egress", "Ingress"]
    (deployment,) = by_kind(docs, "Deployment")
    assert _selects(policy["spec"]["podSelector"], deployment["spec"]["template"]["metadata"]["labels"])
    assert _rules(policy, "ingress") == [(frozenset({(18742, "TCP")}), [{"namespaceSelector": {}}])]
    assert _rules(policy, "egress") == [(frozenset({(53, "UDP"), (53, "TCP")}), None),
                                        (frozenset({(8000, "TCP")}), None)]


def test_network_policy_targets_the_charts_vllm_pods(engine: HelmEngine) -> None:
    docs = render(engine, CHART / "ci" / "selfcontained-values.yaml")
    policy = _policy(docs)
    (engine_rule,) = [r for r in _rules(policy, "egress") if (8000, "TCP") in r[0]]
    (peer,) = engine_rule[1]  # type: ignore[misc]
    vllm = next(d for d in by_kind(docs, "Deployment") if d["metadata"]["name"].endswith("-vllm"))
    exporter = next(d for d in by_kind(docs, "Deployment") if not d["metadata"]["name"].endswith("-vllm"))
    assert _selects(peer["podSelector"], vllm["spec"]["template"]["metadata"]["labels"])
    assert not _selects(peer["podSelector"], exporter["spec"]["template"]["metadata"]["labels"])
    assert not _selects(policy["spec"]["podSelector"], vllm["spec"]["template"]["metadata"]["labels"])


def test_network_policy_narrowed_example(engine: HelmEngine) -> None:
    policy = _policy(render(engine, CHART / "ci" / "networkpolicy-values.yaml"))
    monitoring = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}
    assert _rules(policy, "ingress") == [(frozenset({(18742, "TCP")}), [monitoring])]
    egress = dict(_rules(policy, "egress"))  # type: ignore[arg-type]
    assert egress[frozenset({(53, "UDP"), (53, "TCP")})][0]["podSelector"]["matchLabels"] == {"k8s-app": "kube-dns"}
    assert egress[frozenset({(8080, "TCP")})] == [{"ipBlock": {"cidr": "10.42.0.0/16"}}]
    # the collector's port comes from OTEL_EXPORTER_OTLP_ENDPOINT in exporter.extraEnv
    observability = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "observability"}}}
    assert egress[frozenset({(4318, "TCP")})] == [observability]
    assert len(egress) == 3


@pytest.mark.parametrize(
    ("values", "engine_port"),
    [
        ({"exporter": {"target": "https://vllm.example.internal"}}, 443),
        ({"exporter": {"target": "http://vllm.example.internal/v1"}}, 80),
        ({"exporter": {"target": "http://10.0.0.7:8001"}}, 8001),
        ({"exporter": {"target": "http://[fd00::7]:9000"}}, 9000),
        ({"exporter": {"target": ""}}, None),  # the embedded engine: no engine egress
        ({"exporter": {"target": "http://vllm:8000"}, "networkPolicy": {"egress": {"engine": {"port": 8080}}}}, 8080),
    ],
)
def test_network_policy_engine_port(engine: HelmEngine, tmp_path: Path, values: dict[str, Any],
                                    engine_port: int | None) -> None:
    ports = {
        port for ports, _ in _rules(_policy(render(engine, _values(tmp_path, values))), "egress") for port in ports
    }
    assert ports - {(53, "UDP"), (53, "TCP")} == ({(engine_port, "TCP")} if engine_port else set())


def test_network_policy_otlp_port_and_nothing_out(engine: HelmEngine, tmp_path: Path) -> None:
    values = {"exporter": {"target": "", "extraEnv": [
        {"name": "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "value": "https://collector.example:4317"}]},
        "networkPolicy": {"egress": {"dns": {"enabled": False}}}}
    assert _rules(_policy(render(engine, _values(tmp_path, values))), "egress") == [(frozenset({(4317, "TCP")}), None)]
    values["exporter"]["extraEnv"] = []
    policy = _policy(render(engine, _values(tmp_path, values)))
    assert policy["spec"]["egress"] == [] and "Egress" in policy["spec"]["policyTypes"]  # deny all out


@pytest.mark.parametrize("values_file", ["sidecar-values.yaml", "sweep-existing-configmap-values.yaml"])
def test_no_network_policy_on_a_pod_that_is_not_the_exporters(engine: HelmEngine, values_file: str) -> None:
    """Sidecar: the pod is vLLM's (a policy would cut its clients off); mode none: no exporter pod."""
    assert not by_kind(render(engine, CHART / "ci" / values_file), "NetworkPolicy")


def test_network_policy_opens_the_trace_port_to_the_engine_alone(engine: HelmEngine, tmp_path: Path) -> None:
    """Issue 24: the policy let every namespace reach the port the traces came in on. Now the
    receiver's port is opened only in passive mode, to `tracesFrom`, else the chart's vLLM pods,
    else the release namespace's pods: never `namespaceSelector: {}`."""
    assert all((18743, "TCP") not in ports for ports, _ in _rules(_policy(render(engine, None)), "ingress"))
    rules = dict(_rules(_policy(render(engine, CHART / "ci" / "passive-values.yaml")), "ingress"))  # type: ignore[arg-type]
    assert rules[frozenset({(18743, "TCP")})] == [{"podSelector": {"matchLabels": {"app.kubernetes.io/name": "vllm"}}}]
    plain = dict(_rules(_policy(render(engine, _values(tmp_path, {"exporter": {"passive": True}}))), "ingress"))  # type: ignore[arg-type]
    assert plain[frozenset({(18743, "TCP")})] == [{"podSelector": {}}]  # this namespace's pods only
    docs = render(engine, _values(tmp_path, {"exporter": {"passive": True}, "vllm": {"enabled": True}}, "own.yaml"))
    own = dict(_rules(_policy(docs), "ingress"))  # type: ignore[arg-type]
    (peer,) = own[frozenset({(18743, "TCP")})]  # type: ignore[misc]
    vllm = next(d for d in by_kind(docs, "Deployment") if d["metadata"]["name"].endswith("-vllm"))
    assert _selects(peer["podSelector"], vllm["spec"]["template"]["metadata"]["labels"])


def test_tokens_reach_the_exporter_the_service_monitor_and_the_helm_test(engine: HelmEngine, tmp_path: Path) -> None:
    values = {"exporter": {"metricsTokenSecret": {"name": "pdx-metrics", "key": "t"}},
              "serviceMonitor": {"enabled": True}}
    docs = render(engine, _values(tmp_path, values))
    assert _secret_ref(_env(_exporter(docs)), "PDEXPORTER_METRICS_TOKEN") == {"name": "pdx-metrics", "key": "t"}
    (monitor,) = by_kind(docs, "ServiceMonitor")
    assert monitor["spec"]["endpoints"][0]["authorization"] == {"type": "Bearer",
                                                                "credentials": {"name": "pdx-metrics", "key": "t"}}
    (test_pod,) = [d for d in by_kind(docs, "Pod") if d["metadata"]["name"].endswith("test-metrics")]
    (container,) = test_pod["spec"]["containers"]
    assert "Authorization: Bearer ${PDEXPORTER_METRICS_TOKEN}" in container["args"][0]
    assert _secret_ref(_env(container), "PDEXPORTER_METRICS_TOKEN") == {"name": "pdx-metrics", "key": "t"}
    # the traces token only where there is a receiver
    values = {"exporter": {"tracesTokenSecret": {"name": "otlp", "key": "t"}}}
    assert "PDEXPORTER_TRACES_TOKEN" not in _env(_exporter(render(engine, _values(tmp_path, values, "t.yaml"))))


def test_the_trace_port_must_differ_from_the_metrics_port(engine: HelmEngine, tmp_path: Path) -> None:
    values = _values(tmp_path, {"exporter": {"passive": True, "tracesPort": 18742}})
    with pytest.raises(Exception, match=r"exporter\.tracesPort=18742 is exporter\.port"):
        engine.template(CHART, values, RELEASE, NAMESPACE)


def test_network_policy_can_be_turned_off(engine: HelmEngine, tmp_path: Path) -> None:
    assert not by_kind(render(engine, _values(tmp_path, {"networkPolicy": {"enabled": False}})), "NetworkPolicy")
