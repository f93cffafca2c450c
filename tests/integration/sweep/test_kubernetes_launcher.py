"""The kubernetes launcher's commands, run against fake `helm`/`kubectl` binaries on PATH.

`helm` and `kubectl` here are TEST DOUBLES (shell scripts that log their argv and print a canned
Deployment): there is no cluster on this machine. The engine's /health is a small aiohttp app,
also a test double. What is checked is the exact command lines and their order.
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest
from aiohttp import web

from pdexporter.errors import ConfigError, EngineError
from pdexporter.launch.kubernetes import KubernetesLauncher, with_chunk_arg
from pdexporter.launch.specs import KubernetesLauncherSpec

pytestmark = pytest.mark.integration

DEPLOYMENT = {
    "spec": {"template": {"spec": {"containers": [
        {"name": "vllm", "args": ["serve", "Qwen/Qwen3", "--max-num-batched-tokens=8192", "--enable-prefix-caching"]},
    ]}}}
}


def fake_binary(bindir: Path, name: str, log: Path, stdout: str = "", exit_code: int = 0) -> None:
    script = bindir / name
    body = (
        "#!/usr/bin/env python3\n"
        "import json, sys\n"
        f"open({str(log)!r}, 'a').write(json.dumps([{name!r}, *sys.argv[1:]]) + '\\n')\n"
        f"sys.stdout.write({stdout!r})\n"
        f"sys.exit({exit_code})\n"
    )
    script.write_text(body)
    script.chmod(script.stat().st_mode | stat.S_IEXEC)


@pytest.fixture
async def health_url():  # type: ignore[no-untyped-def]
    async def health(_: web.Request) -> web.Response:
        return web.Response(text="")

    app = web.Application()
    app.router.add_get("/health", health)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    yield f"http://127.0.0.1:{port}"
    await runner.cleanup()


@pytest.fixture
def bindir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "bin"
    path.mkdir()
    monkeypatch.setenv("PATH", f"{path}{os.pathsep}{os.environ['PATH']}")
    return path


def calls(log: Path) -> list[list[str]]:
    return [json.loads(line) for line in log.read_text().splitlines()]


async def test_helm_upgrade_reuses_values_and_sets_the_chunk(bindir: Path, tmp_path: Path, health_url: str) -> None:
    log = tmp_path / "calls.jsonl"
    fake_binary(bindir, "helm", log)
    spec = KubernetesLauncherSpec(kind="kubernetes", tool="helm", url=health_url, release="vllm", chart="./chart",
                                  namespace="llm", rollout_timeout_s=300)
    launcher = KubernetesLauncher(spec)
    handle = await launcher.start(2048)
    assert handle.chunk_size == 2048 and handle.url == health_url
    await launcher.start(2048)  # already there: nothing runs
    await launcher.start(4096)
    assert calls(log) == [
        ["helm", "upgrade", "vllm", "./chart", "--reuse-values", "--set", "vllm.chunkSize=2048",
         "--wait", "--timeout", "300s", "--namespace", "llm"],
        ["helm", "upgrade", "vllm", "./chart", "--reuse-values", "--set", "vllm.chunkSize=4096",
         "--wait", "--timeout", "300s", "--namespace", "llm"],
    ]


async def test_kubectl_patches_the_args_then_waits_for_rollout(bindir: Path, tmp_path: Path, health_url: str) -> None:
    log = tmp_path / "calls.jsonl"
    fake_binary(bindir, "kubectl", log, stdout=json.dumps(DEPLOYMENT))
    spec = KubernetesLauncherSpec(kind="kubernetes", tool="kubectl", url=health_url, deployment="vllm",
                                  namespace="llm", kube_context="gpu", rollout_timeout_s=600)
    await KubernetesLauncher(spec).start(16384)
    got = calls(log)
    assert got[0] == ["kubectl", "get", "deployment", "vllm", "-o", "json", "--namespace", "llm", "--context", "gpu"]
    assert got[1][:5] == ["kubectl", "patch", "deployment", "vllm", "--type=json"]
    patch = json.loads(got[1][6])
    assert patch == [{"op": "replace", "path": "/spec/template/spec/containers/0/args",
                      "value": ["serve", "Qwen/Qwen3", "--max-num-batched-tokens=16384", "--enable-prefix-caching"]}]
    assert got[2] == ["kubectl", "rollout", "status", "deployment/vllm", "--timeout=600s", "--namespace", "llm",
                      "--context", "gpu"]


async def test_failures_are_one_line(bindir: Path, tmp_path: Path, health_url: str) -> None:
    log = tmp_path / "calls.jsonl"
    fake_binary(
        bindir, "helm", log, stdout="Error: UPGRADE FAILED: release vllm has no deployed releases\n", exit_code=1
    )
    spec = KubernetesLauncherSpec(kind="kubernetes", url=health_url, release="vllm", chart="c")
    with pytest.raises(EngineError, match="helm upgrade failed: Error: UPGRADE FAILED"):
        await KubernetesLauncher(spec).start(2048)


async def test_a_missing_tool_is_a_config_error(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    spec = KubernetesLauncherSpec(kind="kubernetes", url="http://127.0.0.1:9", release="r", chart="c")
    with pytest.raises(ConfigError, match="launcher.tool: helm is not on PATH"):
        await KubernetesLauncher(spec).start(2048)


def test_chunk_arg_forms() -> None:
    assert with_chunk_arg(["--max-num-batched-tokens", "8192", "--x"], "--max-num-batched-tokens", 2048) == [
        "--max-num-batched-tokens", "2048", "--x"]
    assert with_chunk_arg(["--max-num-batched-tokens=8192"], "--max-num-batched-tokens", 2048) == [
        "--max-num-batched-tokens=2048"]
    assert with_chunk_arg(["serve", "m"], "--max-num-batched-tokens", 2048) == [
        "serve", "m", "--max-num-batched-tokens", "2048"]
