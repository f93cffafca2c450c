"""The host monitor GPU session 11 ran beside the grid (scripts/gpu/host_monitor.py) and the join of
every repetition with its samples (scripts/gpu/host_levels.py): real processes for the first, the
pure window arithmetic for the second."""

from __future__ import annotations

import datetime
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.helpers import REPO, gpu_script


@pytest.mark.skipif(not Path("/proc/self/schedstat").exists(), reason="needs Linux /proc schedstat")
def test_monitor_samples_cpus_and_the_watched_threads_on_the_monotonic_clock(tmp_path: Path) -> None:
    # a busy process whose command line has the argument "pdexporter", as the sweep's (-m pdexporter) does,
    # and an idle one whose path merely holds the word: only the first is watched
    busy = subprocess.Popen([sys.executable, "-c", "import time\nt = time.time()\nwhile time.time() - t < 30: pass",
                             "pdexporter"])
    idle = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)", "/tmp/pdexporter-venv/x"])
    out = tmp_path / "host.jsonl"
    t0 = time.monotonic_ns()
    mon = subprocess.Popen([sys.executable, str(REPO / "scripts" / "gpu" / "host_monitor.py"), str(out),
                            "--interval", "0.05"])
    try:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and (not out.exists() or out.read_text().count("\n") < 1):
            time.sleep(0.1)
        time.sleep(0.5)
    finally:
        mon.send_signal(signal.SIGTERM)  # what seed-grid-h200.sh sends: the file is flushed and closed
        mon.wait(timeout=20)
        for proc in (busy, idle):
            proc.kill()
            proc.wait()
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(lines) >= 3
    assert all(t0 <= s["t"] <= time.monotonic_ns() for s in lines)  # the records' clock (CLOCK_MONOTONIC)
    assert all(len(s["cpu"]) == (os.cpu_count() or 1) + 1 and len(s["cpu"][0]) == 8 for s in lines)
    topo = json.loads(out.with_suffix(".topology.json").read_text())
    assert "cpu0" in topo["siblings"] and "0" in topo["siblings"]["cpu0"].replace("-", ",").split(",")
    assert all(s["spin"][0] > 0 and 0 <= s["spin"][1] < (os.cpu_count() or 1) for s in lines)  # the CPU speed probe
    rows = [s["thr"][f"{busy.pid}/{busy.pid}"] for s in lines if f"{busy.pid}/{busy.pid}" in s["thr"]]
    assert len(rows) >= 2 and rows[-1][2] > rows[0][2]  # its time on a CPU grows, and only moved threads are written
    assert all(0 <= r[1] < (os.cpu_count() or 1) for r in rows)
    assert not any(key.startswith(f"{idle.pid}/") for s in lines for key in s["thr"])


def test_a_window_takes_the_busiest_engine_core_and_the_samples_around_it() -> None:
    levels = gpu_script("host_levels")
    ms = 1_000_000
    comm = levels.ENGINE_COMM

    def sample(t: int, a: list, b: list) -> dict:
        cpus = [[0] * 7 + [t // ms // 20 if i == 3 else 0] for i in range(8)]  # CPU 3 has a fifth of the steal
        return {"t": t, "w": t, "cpu": [[0] * 7 + [t // ms], *cpus], "spin": [1_000_000 + t // 100, 0],
                "thr": {"10/10": [comm, *a], "20/20": [comm, *b], "10/11": ["worker", 0, 0, 0, 0, 0]}}

    # engine 10 on CPU 3 runs 80 of 100 ms and waits 10 on the run queue; engine 20 (held) barely moves
    samples = [sample(0, [3, 0, 0, 0, 0], [5, 0, 0, 0, 0]),
               sample(100 * ms, [3, 80 * ms, 10 * ms, 8, 0], [5, ms, 0, 0, 0])]
    times = [s["t"] for s in samples]
    threads = levels.engine_threads(samples)
    assert set(threads) == {"10/10", "20/20"}  # main threads of the engine cores only
    gpu = [(50 * ms, 1980.0, 400.0, 0x1), (60 * ms, 1700.0, 600.0, 0x4)]
    out = levels.window_stats(20 * ms, 70 * ms, times, samples, threads, gpu)
    assert out["engine_cpu"] == 3
    assert out["engine_on_cpu"] == pytest.approx(0.8) and out["engine_runq_wait"] == pytest.approx(0.1)
    assert out["bracket_ms"] == pytest.approx(100.0) and out["steal_ticks"] == 100
    assert out["engine_cpu_steal"] == 5  # the per-CPU line of the engine core's CPU, not the total
    assert out["spin_us"] == pytest.approx(1500.0)  # both bracketing samples' loop times, 1.0 and 2.0 ms
    assert out["sm_mhz_min"] == 1700.0 and out["clock_event"] == 1  # 0x4, a power cap; 0x1 (idle) is not one


def test_each_machine_keeps_its_own_monotonic_axis(tmp_path: Path) -> None:
    """GPU session 12's grid ran on three machines: their monotonic clocks overlap, so samples are kept
    per boot (wall minus monotonic) and a window goes to the machine whose clock it was read on."""
    levels = gpu_script("host_levels")
    s = 1_000_000_000
    boots = {"a": 1_796_000_000 * s, "b": 1_796_000_900 * s}  # wall time at each machine's boot
    for name, boot in boots.items():
        lines = [{"t": t * s, "w": boot + t * s, "cpu": [[0] * 8], "thr": {}} for t in (100, 101, 102)]
        (tmp_path / f"host-{name}.jsonl").write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    machines = levels.load_monitor(tmp_path)
    assert len(machines) == 2 and all(m[0] == [100 * s, 101 * s, 102 * s] for m in machines.values())
    a = levels.machine_of(machines, 101 * s, boots["a"] / s + 101)
    b = levels.machine_of(machines, 101 * s, boots["b"] / s + 101)
    assert a is not None and b is not None and a != b
    assert levels.machine_of(machines, 101 * s, boots["b"] / s + 5000) is None


def test_the_launch_probe_writes_a_sample_an_interval_on_both_clocks(tmp_path: Path) -> None:
    """scripts/gpu/launch_probe.py with --fake (a Python call timed in place of a CUDA launch: the file's form,
    not the launch path) writes one line an interval on the records' clock, and ends cleanly on SIGTERM."""
    out = tmp_path / "launch-1.jsonl"
    t0 = time.monotonic_ns()
    probe = subprocess.Popen([sys.executable, str(REPO / "scripts" / "gpu" / "launch_probe.py"), str(out),
                              "--fake", "--interval", "0.05", "--launches", "50"])
    try:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and (not out.exists() or out.read_text().count("\n") < 3):
            time.sleep(0.05)
    finally:
        probe.send_signal(signal.SIGTERM)
        assert probe.wait(timeout=20) == 0
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(lines) >= 3 and all(t0 <= s["t"] <= time.monotonic_ns() for s in lines)
    assert all(s["launch"][0] > 0 and s["launch"][1] == 50 for s in lines)
    assert all(abs((s["w"] - s["t"]) - (lines[0]["w"] - lines[0]["t"])) < 50_000_000 for s in lines)
    bad = subprocess.run([sys.executable, str(REPO / "scripts" / "gpu" / "launch_probe.py"), str(out), "--fake",
                          "--interval", "0"], capture_output=True, text=True)
    assert bad.returncode != 0 and "--interval 0.0" in bad.stderr


def test_a_repetition_is_paired_with_the_launch_speed_around_its_window(tmp_path: Path) -> None:
    """`host_levels.rows` pairs each repetition with the probe's samples within one interval of its window
    (`launch_us`), on the machine whose clock the window was read on, with no host monitor beside it."""
    import gzip

    levels = gpu_script("host_levels")
    s, ms = 1_000_000_000, 1_000_000
    boot = 1_796_000_000 * s  # the wall time at the machine's boot
    # the probe every 2 s from t = 100 s: 5 us a launch, then 10 us from t = 120 s (the slow level)
    probe = [{"t": t * s, "w": boot + t * s, "launch": [5000.0 if t < 120 else 10000.0, 200]}
             for t in range(100, 140, 2)]
    results, monitor = tmp_path / "r", tmp_path / "m"
    (results / "8192" / "raw").mkdir(parents=True)
    monitor.mkdir()
    (monitor / "launch-1.jsonl").write_text("\n".join(json.dumps(x) for x in probe) + "\n")
    reps = []
    for i, (t_inject, penalty) in enumerate(((105, 20.0), (111, 21.0), (125, 40.0), (131, 41.0))):
        raw = {"t_inject_clock_ns": t_inject * s, "t_first_ns": 30 * ms}
        with gzip.open(results / "8192" / "raw" / f"D4_P1024_r{i}.json.gz", "wt") as f:
            json.dump(raw, f)
        started = datetime.datetime.fromtimestamp((boot + t_inject * s) / s, tz=datetime.UTC)
        reps.append({"rep": i, "raw": f"raw/D4_P1024_r{i}.json.gz", "started_at": started.isoformat(),
                     "derived": {"tpot_penalty_ms": penalty}, "interference": {"num_chunks_actual": 1}})
    record = {"config": {"chunk_size": 8192, "decode_batch_size": 4, "new_prefill_tokens": 1024}, "reps": reps}
    (results / "8192" / "D4_P1024.json").write_text(json.dumps(record))
    table = levels.rows(results, monitor)
    assert [r["launch_us"] for r in table] == [5.0, 5.0, 10.0, 10.0]
    assert [round(r["ratio"], 3) for r in table] == [0.656, 0.689, 1.311, 1.344]  # against the median, 30.5 ms
    far = levels.launch_at(([100 * s], [5.0]), 200 * s, 200 * s + 30 * ms)
    assert far is None  # no sample within 5 s: no figure rather than a stale one


def test_the_summary_reads_the_level_against_the_launch_speed_per_prompt(capsys: pytest.CaptureFixture[str]) -> None:
    levels = gpu_script("host_levels")
    table = [{"P": 512, "chunks": 1, "ratio": q, "launch_us": u} for q, u in ((0.7, 5.0), (0.72, 5.1), (1.0, 7.0),
                                                                             (1.3, 10.0), (1.32, 9.8))]
    table += [{"P": 4096, "chunks": 1, "ratio": q, "launch_us": u} for q, u in ((0.95, 10.0), (1.0, 5.0), (1.05, 7.5))]
    levels.summarise(table)
    out = capsys.readouterr().out
    line = next(x for x in out.splitlines() if x.startswith("P = 512:"))
    assert "Pearson r 1.00 over 5" in line and "fast 5.050 (2)" in line and "slow 9.900 (2)" in line
    assert "near 7.000 (1)" in line
    control = next(x for x in out.splitlines() if x.startswith("P = 4096:"))
    assert "over 3" in control and "slow" not in control  # a control without levels: its repetitions all near
