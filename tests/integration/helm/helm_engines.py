"""The Helm engines a test can use: the `helm` binary, or Helm's own Go SDK through helm-python-sdk.

No Helm binary ships in Debian 12, PyPI or npm. helm-python-sdk (PyPI) bundles libhelm_c, a C ABI
over Helm's official Go SDK (v4): `lint` and `render` there are Helm's lint and template code, the
same as `helm lint` / `helm template`, called without the CLI. Tests run every engine present and
say which ran; with none present they skip with the reason.
"""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import yaml


class HelmEngine(Protocol):
    name: str

    def lint(self, chart: Path, values_file: Path | None) -> list[str]: ...

    def template(self, chart: Path, values_file: Path | None, release: str, namespace: str) -> str: ...


@dataclass
class HelmBinary:
    path: str
    name: str = "helm binary"

    def lint(self, chart: Path, values_file: Path | None) -> list[str]:
        cmd = [self.path, "lint", "--strict", str(chart)] + (["-f", str(values_file)] if values_file else [])
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        return [] if proc.returncode == 0 else [proc.stdout + proc.stderr]

    def template(self, chart: Path, values_file: Path | None, release: str, namespace: str) -> str:
        cmd = [self.path, "template", release, str(chart), "--namespace", namespace]
        cmd += ["-f", str(values_file)] if values_file else []
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        if proc.returncode != 0:
            raise RuntimeError(proc.stderr)
        return proc.stdout


class HelmGoSdk:
    """helm-python-sdk: Helm's Go SDK (lint + offline render) through ctypes."""

    name = "helm Go SDK (helm-python-sdk)"

    def __init__(self) -> None:
        import helm_python

        self.helm = helm_python
        self.version = f"{helm_python.helm_sdk_version()} via helm-c-sdk {helm_python.helm_c_version()}"

    @staticmethod
    def _values(values_file: Path | None) -> dict[str, Any] | None:
        return yaml.safe_load(values_file.read_text()) if values_file else None

    def lint(self, chart: Path, values_file: Path | None) -> list[str]:
        report = self.helm.lint(str(chart), self._values(values_file), strict=True)
        # severity 1 = info ("icon is recommended"); strict lint fails on warnings (2) and errors (3)
        problems = [f"{m['path']}: {m['error']}" for m in report.get("messages", []) if m.get("severity", 0) >= 2]
        return problems + list(report.get("errors") or [])

    def template(self, chart: Path, values_file: Path | None, release: str, namespace: str) -> str:
        with self.helm.Chart.load(str(chart)) as loaded:
            rendered = loaded.render(self._values(values_file), name=release, namespace=namespace, is_install=True)
        docs = []
        for path in sorted(rendered):
            if path.endswith("NOTES.txt") or not rendered[path].strip():
                continue
            docs.append(f"---\n# Source: {path}\n{rendered[path]}")
        return "\n".join(docs)

    def notes(self, chart: Path, values_file: Path | None, release: str, namespace: str) -> str:
        with self.helm.Chart.load(str(chart)) as loaded:
            rendered = loaded.render(self._values(values_file), name=release, namespace=namespace, is_install=True)
        return next(text for path, text in rendered.items() if path.endswith("NOTES.txt"))


def available_engines() -> list[HelmEngine]:
    engines: list[HelmEngine] = []
    if binary := shutil.which("helm"):
        engines.append(HelmBinary(binary))
    try:
        engines.append(HelmGoSdk())
    except ImportError:
        pass
    return engines


def manifests(text: str) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(text) if doc]
