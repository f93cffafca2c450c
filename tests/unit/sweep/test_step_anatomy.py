"""scripts/gpu/step_anatomy.py (the inside of vLLM's steps from its torch profiler trace) on a synthetic trace of the
profiler's form, built here with known answers, and scripts/gpu/profile_window.py against a real local HTTP server
standing in for vLLM's profiler endpoints (a test double: no engine runs here)."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from tests.helpers import REPO, gpu_script


class _Trace:
    """Events in torch.profiler's Chrome-trace form: a forward span on the engine's thread, its launch calls, and
    the kernels they launched (sharing `args.correlation`)."""

    def __init__(self, named: bool = False) -> None:
        self.events: list[dict] = []
        self.corr = 0
        self.named = named  # vLLM's worker's step spans around each forward, as while it profiles

    def _step(self, t: float, dur: float, prompt: int, decodes: int) -> None:
        if self.named:  # 100 µs of preparation before the forward, 50 after
            self._x("user_annotation", f"execute_context_{int(prompt > 0)}({prompt})_generation_{decodes}({decodes})",
                    t - 100, dur + 150)

    def _x(self, cat: str, name: str, ts: float, dur: float, **args: object) -> None:
        self.events.append({"ph": "X", "cat": cat, "name": name, "pid": 1, "tid": 1 if cat != "kernel" else 7,
                            "ts": ts, "dur": dur, "args": args})

    def graph_step(self, t: float, cpu_us: float = 300.0) -> None:
        self._step(t, cpu_us, 0, 4)
        self._x("user_annotation", "gpu_model_runner: forward", t, cpu_us)
        self.corr += 1
        self._x("cuda_runtime", "cudaGraphLaunch", t + 100, 20, correlation=self.corr)
        self._x("kernel", "graph_kernel", t + 150, 1500, correlation=self.corr)

    def eager_step(self, t: float, launches: int, gap_us: float, kernel_us: float, prompt: int = 512) -> None:
        """`launches` launch calls of 5 µs every `gap_us` (the dispatch between them), each kernel `kernel_us` on a
        GPU that keeps up or falls behind."""
        self._step(t, launches * gap_us, prompt, 4)
        self._x("user_annotation", "gpu_model_runner: forward", t, launches * gap_us)
        gpu_free = t
        for i in range(launches):
            self.corr += 1
            ts = t + i * gap_us
            self._x("cuda_runtime", "cudaLaunchKernel", ts, 5, correlation=self.corr)
            start = max(ts + 8, gpu_free)
            self._x("kernel", "gemm", start, kernel_us, correlation=self.corr)
            gpu_free = start + kernel_us

    def write(self, path: Path) -> Path:
        with gzip.open(path, "wt") as f:
            json.dump({"traceEvents": self.events, "displayTimeUnit": "ms"}, f)
        return path


def _trace(named: bool = False) -> _Trace:
    """One-chunk prompts (P 512: 100 launches of 20 µs kernels; P 1024: 40 µs) at a fast dispatch (50 µs between
    launches) in even seconds and a slow one (100 µs) in odd seconds, and the big prompt (P 4096: 300 µs kernels,
    GPU-bound) slower where the small ones are fast; graph steps between them."""
    tr = _Trace(named)
    for sec in range(12):
        base = sec * 1_000_000.0
        slow = sec % 2 == 1
        tr.eager_step(base, 100, 100.0 if slow else 50.0, 20.0, 512)
        tr.eager_step(base + 200_000, 100, 100.0 if slow else 50.0, 40.0, 1024)
        tr.eager_step(base + 400_000, 100, 50.0, 280.0 if slow else 330.0, 4096)
        for k in range(5):
            tr.graph_step(base + 600_000 + k * 50_000)
    return tr


def test_steps_are_timed_inside_and_the_slow_state_is_read_on_the_cpu_side(tmp_path: Path) -> None:
    anatomy = gpu_script("step_anatomy")
    rows = anatomy.steps(anatomy.load(_trace().write(tmp_path / "w.pt.trace.json.gz")))
    assert len(rows) == 12 * 8 and sum(r["graph"] for r in rows) == 60
    groups = anatomy.group_eager(rows, [4096, 512, 1024])
    assert sorted(groups) == [512, 1024, 4096] and all(len(g) == 12 for g in groups.values())
    fast = next(r for r in groups[512] if r["t"] == 0.0)
    assert fast["launches"] == 100 and fast["launch_us"] == 5.0
    assert fast["cpu_ms"] == pytest.approx(5.0) and fast["dispatch_ms"] == pytest.approx(4.5)
    assert fast["gpu_ms"] == pytest.approx(2.0)  # 100 kernels of 20 µs, the GPU idle between them
    big = next(r for r in groups[4096] if r["t"] == 400_000.0)  # an even second: 330 µs kernels
    assert big["gpu_ms"] == pytest.approx(33.0) and big["wall_ms"] > big["cpu_ms"]  # GPU-bound: it ends after the CPU
    table = "\n".join(anatomy.compare(groups[512]))
    assert "| cpu_ms | 5.000 | 10.000 | 2.00 | +1.00 |" in table  # the slow state is the CPU's side ...
    assert "| gpu_ms | 2.000 | 2.000 | 1.00 |" in table  # ... the kernels took as long
    states = "\n".join(anatomy.states(groups, [r for r in rows if r["graph"]], bin_s=1.0))
    assert "r(P = 512 wall, P = 4096 wall) -1.00 over 12 bins" in states
    text = anatomy.report(rows, [512, 1024, 4096])
    assert "96 steps: 60 graph steps, 36 eager steps grouped by GPU time as P = 512, 1024, 4096" in text


def test_vllms_step_spans_name_each_step_by_what_it_ran(tmp_path: Path) -> None:
    """While it profiles, vLLM's worker names each step `execute_context_R(T)_generation_G(N)`: the eager steps are
    grouped by their tokens (P), whatever their GPU time, and the step's CPU time holds the forward's and more."""
    anatomy = gpu_script("step_anatomy")
    rows = anatomy.steps(anatomy.load(_trace(named=True).write(tmp_path / "n.pt.trace.json.gz")))
    assert len(rows) == 96 and {(r["prefills"], r["D"]) for r in rows} == {(0, 4), (1, 4)}
    groups = anatomy.group_eager(rows, [1, 2, 3])  # --prompts is not used where steps are named
    assert sorted(groups) == [512, 1024, 4096] and all(len(g) == 12 for g in groups.values())
    fast = next(r for r in groups[512] if r["t"] == -100.0)
    assert fast["forward_ms"] == pytest.approx(5.0) and fast["cpu_ms"] == pytest.approx(5.15)
    assert fast["dispatch_ms"] == pytest.approx(4.65) and fast["gpu_ms"] == pytest.approx(2.0)
    md = tmp_path / "anatomy.md"
    proc = subprocess.run([sys.executable, "scripts/gpu/step_anatomy.py", str(tmp_path / "n.pt.trace.json.gz"),
                           "--md", str(md), "--csv", str(tmp_path / "a.csv")], cwd=REPO, capture_output=True,
                          text=True, check=False, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "step_anatomy: 1/1 traces read (n.pt.trace.json.gz: 96 steps)" in proc.stderr and "ETA 0 s" in proc.stderr
    text = md.read_text()
    assert "96 steps: 60 graph steps, 36 eager steps named by their tokens as P = 512, 1024, 4096." in text
    assert "| forward_ms | 5.000 | 10.000 | 2.00 | +1.00 |" in text
    header = (tmp_path / "a.csv").read_text().splitlines()[0]
    assert header.startswith("trace,t,graph,prefills,D,P,wall_ms,cpu_ms,forward_ms")


def test_a_file_that_is_no_trace_or_has_no_forward_is_one_line(tmp_path: Path) -> None:
    bad = tmp_path / "x.json"
    bad.write_text("{not json")
    empty = tmp_path / "e.json"
    empty.write_text(json.dumps({"traceEvents": [{"ph": "X", "cat": "kernel", "name": "k", "ts": 0, "dur": 1}]}))
    for path, message in ((bad, "not a torch profiler trace"), (empty, "no step or 'gpu_model_runner: forward' span")):
        proc = subprocess.run([sys.executable, "scripts/gpu/step_anatomy.py", str(path)], cwd=REPO,
                              capture_output=True, text=True, check=False, timeout=60)
        assert proc.returncode == 2 and proc.stdout == ""
        assert proc.stderr.startswith(f"{path}: {message}") and len(proc.stderr.strip().splitlines()) == 1


class _Profiler(BaseHTTPRequestHandler):
    """vLLM's /health, /start_profile and /stop_profile (the double); `refuse` answers 404 to both POSTs."""

    posts: list[str] = []
    refuse = False

    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        self.send_response(200 if self.path == "/health" else 404)
        self.end_headers()

    def do_POST(self) -> None:  # noqa: N802
        type(self).posts.append(self.path)
        self.send_response(404 if type(self).refuse else 200)
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


@pytest.mark.parametrize("refuse", [False, True])
def test_the_profile_windows_open_and_close_in_order(tmp_path: Path, refuse: bool) -> None:
    window = gpu_script("profile_window")
    handler = type("H", (_Profiler,), {"posts": [], "refuse": refuse})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}"
        out = tmp_path / "windows.jsonl"
        assert window.main([str(out), "--url", url, "--at", "0.1", "--at", "0", "--for", "0.05"]) == 0
    finally:
        server.shutdown()
    assert handler.posts == ["/start_profile", "/stop_profile"] * 2
    lines = [json.loads(x) for x in out.read_text().splitlines()]
    assert [x["window"] for x in lines] == [0, 1] and all(x["ok"] is not refuse for x in lines)
    assert all(x["start"][0] <= x["start"][1] <= x["stop"][0] <= x["stop"][1] for x in lines)
    assert all(x["stop"][0] - x["start"][1] >= 50_000_000 for x in lines)  # open for --for 0.05 s
    assert all(abs(x["clock_offset_ns"] - (time.time_ns() - time.monotonic_ns())) < 10**9 for x in lines)
    if refuse:
        assert "404" in lines[0]["error"]
