"""scripts/gpu/gil-dumps.sh's dry run (SIM=1): the script the next H100 session runs (results/h100-vllm0.22-llama-3.2-
3b-instruct-counters/PLAN.md) runs end to end on the embedded engine: the anatomy sweep in virtual time, the host
monitor, and thread_counters.py as a real process sampling the sweep's own main thread (the embedded engine runs in
it). Without py-spy the run says so and takes no dumps; with the real py-spy (a test dependency) it finds the sweep's
process as the GPU run finds the engine core, never the sampler started before it (session 40's bug), and dumps it
until it ends. gil_dumps.py's reading of what comes back is tests/unit/analysis/test_gil_dumps_script.py's, and it
reads these dumps too."""

from __future__ import annotations

import gzip
import json
import re
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from tests.helpers import REPO, gpu_dry_run

pytestmark = pytest.mark.integration


def test_the_sweep_runs_with_the_counters_beside_it(tmp_path: Path) -> None:
    proc = gpu_dry_run(tmp_path, "gil-dumps.sh", "h200-dense-llama-3.2-3b-anatomy.yaml", 100,
                       PYSPY=str(tmp_path / "no-py-spy"))
    assert "no dumps" in proc.stdout
    assert "thread counters: task_ns yes" in proc.stdout  # --check's line
    out = tmp_path / "out"
    assert not (out / "dumps.txt.gz").exists()
    header, *rows = [json.loads(x) for x in gzip.decompress((out / "counters.jsonl.gz").read_bytes()).splitlines()]
    assert header["available"]["task_ns"] is True and rows  # the sweep's own main thread, sampled while it ran
    assert all(b["task_ns"] >= a["task_ns"] for a, b in zip(rows, rows[1:], strict=False))
    assert len(list(out.iterdir())) <= 8  # what comes back from the GPU machine


def test_the_real_py_spy_dumps_the_sweeps_process_not_the_sampler(tmp_path: Path) -> None:
    pyspy = shutil.which("py-spy") or shutil.which("py-spy", path=str(Path(sys.executable).parent))
    assert pyspy, "py-spy (a test dependency, pyproject.toml's [test] extras) is not installed"
    _skip_where_the_os_forbids_attaching(pyspy)
    proc = gpu_dry_run(tmp_path, "gil-dumps.sh", "h200-dense-llama-3.2-3b-anatomy.yaml", 100, PYSPY=pyspy)
    text = gzip.decompress((tmp_path / "out" / "dumps.txt.gz").read_bytes()).decode()
    core = re.search(r"^core pid (\d+) at ", text, re.M)
    assert core, text[:2000]
    stamps = re.findall(r"^@@ (\d+\.\d+)$", text, re.M)
    assert stamps and f"dumps: {len(stamps)} taken" in proc.stdout
    dumped = re.findall(r"^Process (\d+): (.*)$", text, re.M)  # py-spy's head line of each readable dump
    assert dumped, text[:2000]
    assert {pid for pid, _ in dumped} == {core.group(1)}
    # A dump taken as the sweep exits reads an empty command line ("Process N: ", the kernel has let go of it; seen
    # with py-spy 0.4 on a process ending under its dumps, and once in CI): no command to check, the pid above is its.
    named = [cmd for _, cmd in dumped if cmd.strip()]
    wrong = [cmd for cmd in named if "pdexporter sim sweep" not in cmd or "thread_counters" in cmd]
    assert named and not wrong, wrong[:3] or dumped[:3]
    assert "MainThread" in text  # a thread's stack, not only the head line
    # the results directory as the GPU run's is committed (RUN.md): the sweep's records at the top, the rest beside
    results = tmp_path / "results"
    with tarfile.open(tmp_path / "out" / "dense.tgz") as tar:
        tar.extractall(tmp_path / "unpacked", filter="data")
    shutil.copytree(tmp_path / "unpacked" / "dense", results)
    for name in ("monitor.tgz", "dumps.txt.gz", "counters.jsonl.gz"):
        shutil.copy(tmp_path / "out" / name, results / name)
    read = subprocess.run([sys.executable, "scripts/gpu/gil_dumps.py", str(results), "--out", str(tmp_path / "gil.md")],
                          cwd=REPO, capture_output=True, text=True, check=False, timeout=120)
    assert read.returncode == 0, read.stderr[-2000:]
    report = (tmp_path / "gil.md").read_text()
    assert f"- {len(stamps)} taken, " in report  # every dump the script took, read back
    readable = re.search(r"(\d+) readable", report)
    assert readable and int(readable.group(1)) >= 1 and "| MainThread |" in report, report[:1500]


def _skip_where_the_os_forbids_attaching(pyspy: str) -> None:
    """py-spy reads another process's memory (ptrace): as root (the GPU machines, CI) always; as a user only where the
    kernel lets a process trace one it did not start (Yama's ptrace_scope 0, or CAP_SYS_PTRACE). The script's dumper
    and the engine are siblings, as `py-spy dump` here and this sleeper are: where it is refused, the test says why."""
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; print('up', flush=True); time.sleep(60)"],
                               stdout=subprocess.PIPE, text=True)
    try:
        assert sleeper.stdout is not None and sleeper.stdout.readline().strip() == "up"  # its interpreter is running
        probe = subprocess.run([pyspy, "dump", "--pid", str(sleeper.pid)], capture_output=True, text=True, timeout=60,
                               check=False)
    finally:
        sleeper.kill()
        sleeper.wait()
    refused = re.search(r"(?i)permission|operation not permitted|ptrace", probe.stderr + probe.stdout)
    if probe.returncode != 0 and refused:
        scope = Path("/proc/sys/kernel/yama/ptrace_scope")
        pytest.skip(f"this OS refuses py-spy a process it did not start (ptrace_scope "
                    f"{scope.read_text().strip() if scope.exists() else '?'}, not root): {probe.stderr.strip()[:200]}")
    assert probe.returncode == 0, probe.stderr[-1000:]
