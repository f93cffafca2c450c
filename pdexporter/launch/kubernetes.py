"""The `kubernetes` launcher: change the chunk size of a deployed engine with `helm upgrade
--reuse-values --set KEY=CHUNK --wait`, or by patching a Deployment's container args with
`kubectl patch` and waiting for `kubectl rollout status`; then wait for /health."""

from __future__ import annotations

import asyncio
import json
import shlex
import shutil
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from pdexporter.client.client import EngineClient
from pdexporter.errors import ConfigError, EngineError
from pdexporter.launch.base import EngineHandle
from pdexporter.launch.specs import KubernetesLauncherSpec

__all__ = [
    "CommandRunner", "KubernetesLauncher", "helm_upgrade_argv", "kubectl_patch_argv", "kubectl_rollout_argv",
    "run_command", "with_chunk_arg",
]

# ---------------------------------------------------------------------------------------------
# Kubernetes launcher

CommandRunner = Callable[[Sequence[str]], Awaitable[tuple[int, str, str]]]


async def run_command(argv: Sequence[str]) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        *argv, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, stdin=asyncio.subprocess.DEVNULL
    )
    out, err = await proc.communicate()
    return proc.returncode or 0, out.decode("utf-8", "replace"), err.decode("utf-8", "replace")


def _scope(spec: KubernetesLauncherSpec) -> list[str]:
    out = []
    if spec.namespace:
        out += ["--namespace", spec.namespace]
    if spec.kube_context:
        out += ["--kube-context" if spec.tool == "helm" else "--context", spec.kube_context]
    return out


def helm_upgrade_argv(helm: str, spec: KubernetesLauncherSpec, chunk_size: int) -> list[str]:
    assert spec.release and spec.chart
    return [
        helm, "upgrade", spec.release, spec.chart, "--reuse-values",
        "--set", f"{spec.value_key}={chunk_size}",
        "--wait", "--timeout", f"{int(spec.rollout_timeout_s)}s", *_scope(spec),
    ]


def with_chunk_arg(args: Sequence[str], arg_name: str, chunk_size: int) -> list[str]:
    """Container args with `arg_name` set to the chunk size (both `--x=N` and `--x N` forms)."""
    out: list[str] = []
    found = False
    skip = False
    for i, arg in enumerate(args):
        if skip:
            skip = False
            continue
        if arg == arg_name and i + 1 < len(args):
            out += [arg_name, str(chunk_size)]
            skip, found = True, True
        elif arg.startswith(arg_name + "="):
            out.append(f"{arg_name}={chunk_size}")
            found = True
        else:
            out.append(arg)
    if not found:
        out += [arg_name, str(chunk_size)]
    return out


def kubectl_patch_argv(kubectl: str, spec: KubernetesLauncherSpec, current_args: Sequence[str] | None,
                       chunk_size: int) -> list[str]:
    path = f"/spec/template/spec/containers/{spec.container}/args"
    op = {"op": "replace" if current_args is not None else "add", "path": path,
          "value": with_chunk_arg(current_args or [], spec.chunk_arg, chunk_size)}
    return [kubectl, "patch", "deployment", str(spec.deployment), "--type=json", "-p",
            json.dumps([op], separators=(",", ":")), *_scope(spec)]


def kubectl_rollout_argv(kubectl: str, spec: KubernetesLauncherSpec) -> list[str]:
    return [kubectl, "rollout", "status", f"deployment/{spec.deployment}",
            f"--timeout={int(spec.rollout_timeout_s)}s", *_scope(spec)]


@dataclass
class KubernetesLauncher:
    spec: KubernetesLauncherSpec
    gpu: str | None = None
    runner: CommandRunner = run_command
    on_message: Callable[[str], None] = lambda text: None
    name: str = "kubernetes"
    commands: list[list[str]] = field(default_factory=list)  # what ran, for the log and tests
    _handle: EngineHandle | None = field(default=None, init=False, repr=False)

    @property
    def can_set_chunk_size(self) -> bool:
        return True

    def _tool(self) -> str:
        found = shutil.which(self.spec.tool)
        if found is None:
            raise ConfigError(f"launcher.tool: {self.spec.tool} is not on PATH")
        return found

    async def _run(self, argv: list[str]) -> str:
        self.commands.append(argv)
        self.on_message("running " + " ".join(shlex.quote(a) for a in argv))
        code, out, err = await self.runner(argv)
        if code != 0:
            detail = (err or out).strip().splitlines()[-1:] or [f"exit code {code}"]
            raise EngineError(f"{Path(argv[0]).name} {argv[1]} failed: {detail[0]}")
        return out

    async def start(self, chunk_size: int) -> EngineHandle:
        if self._handle is not None and self._handle.chunk_size == chunk_size:
            return self._handle
        tool = self._tool()
        if self.spec.tool == "helm":
            await self._run(helm_upgrade_argv(tool, self.spec, chunk_size))
        else:
            text = await self._run(
                [tool, "get", "deployment", str(self.spec.deployment), "-o", "json", *_scope(self.spec)]
            )
            try:
                containers = json.loads(text)["spec"]["template"]["spec"]["containers"]
                current = containers[self.spec.container].get("args")
            except (ValueError, KeyError, IndexError, TypeError) as exc:
                raise EngineError(
                    f"deployment {self.spec.deployment}: no container {self.spec.container} in its spec ({exc})"
                ) from None
            await self._run(kubectl_patch_argv(tool, self.spec, current, chunk_size))
            await self._run(kubectl_rollout_argv(tool, self.spec))
        async with EngineClient(self.spec.url) as client:
            await client.wait_healthy(self.spec.health_timeout_s)
        self._handle = EngineHandle(url=self.spec.url, chunk_size=chunk_size, kind=self.spec.engine, gpu=self.gpu)
        return self._handle

    async def stop(self) -> None:
        self._handle = None  # the deployment stays as it is; pdexporter does not own its life


