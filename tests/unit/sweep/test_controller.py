"""The sweep loop's logic on `StepEngineDouble` (a test double): resume, deadline, CV re-runs,
engine life. The embedded engine's own runs are in tests/integration/sweep."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from engine_double import DoubleProvider, StepEngineDouble

from pdexporter.launch.external import ExternalLauncher
from pdexporter.measure.store import ResultsStore
from pdexporter.sweep.controller import Deadline, SweepController, SweepObserver
from pdexporter.sweep.spec import SweepSpec, parse_sweep

GRID = {"chunk_sizes": [2048, 8192], "decode_batch_sizes": [0, 4], "new_prefill_tokens": [512, 8192]}


def make_spec(mode: str = "fast", **extra: object) -> SweepSpec:
    return parse_sweep({"grid": GRID, "reps": 2, "mode": mode, "cooldown": {"seconds": 0}, **extra})


def record_set(root: Path) -> dict[tuple[int, int, int], list[int]]:
    store = ResultsStore(root)
    return {r.key: [x.rep for x in r.reps] for r in store.iter_records()}


class StopAfter(SweepObserver):
    """Interrupts the sweep after `n` repetitions were recorded (as Ctrl-C would)."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.seen = 0

    def on_rep(self, key, rep, info) -> None:  # type: ignore[no-untyped-def]
        self.seen += 1
        if self.seen == self.n:
            raise KeyboardInterrupt


async def test_complete_sweep_writes_the_seed_layout(tmp_path: Path) -> None:
    provider = DoubleProvider()
    report = await SweepController(make_spec(), ResultsStore(tmp_path), provider).run()
    assert report.status == "complete" and report.complete_configs == 8 == report.total_configs
    assert provider.opened == [2048, 8192] and provider.closed == [True, True]
    records = record_set(tmp_path)
    assert len(records) == 8 and all(reps == [0, 1] for reps in records.values())
    for b in (2048, 8192):
        assert (tmp_path / str(b) / "D4_P8192.json").is_file()
        assert (tmp_path / str(b) / "raw" / "D4_P8192_r1.json.gz").is_file()
        assert (tmp_path / str(b) / "raw" / "D4_baseline.json.gz").is_file()
    state = json.loads((tmp_path / "sweep.json").read_text())
    assert state["invocations"][-1]["status"] == "complete"
    # A rerun has nothing to do and starts no engine.
    provider2 = DoubleProvider()
    report = await SweepController(make_spec(), ResultsStore(tmp_path), provider2).run()
    assert report.complete and provider2.opened == []


@pytest.mark.parametrize("mode", ["fast", "faithful"])
async def test_interrupted_then_rerun_gives_the_same_records(tmp_path: Path, mode: str) -> None:
    await SweepController(make_spec(mode), ResultsStore(tmp_path / "whole"), DoubleProvider()).run()
    cut = tmp_path / "cut"
    provider = DoubleProvider()
    with pytest.raises(KeyboardInterrupt):
        await SweepController(make_spec(mode), ResultsStore(cut), provider, observer=StopAfter(11)).run()
    assert provider.closed == [True, False]  # the engine in use at the interruption is kept
    partial = record_set(cut)
    assert sum(len(v) for v in partial.values()) == 11
    await SweepController(make_spec(mode), ResultsStore(cut), DoubleProvider()).run()
    assert record_set(cut) == record_set(tmp_path / "whole")
    # The values agree too: the double is deterministic.
    whole, resumed = ResultsStore(tmp_path / "whole"), ResultsStore(cut)
    for key in record_set(cut):
        a, b = whole.load_record(*key), resumed.load_record(*key)
        assert a.derived.tpot_penalty_p50_ms == b.derived.tpot_penalty_p50_ms


async def test_phase1_is_reused_after_a_resume(tmp_path: Path) -> None:
    store = ResultsStore(tmp_path)
    with pytest.raises(KeyboardInterrupt):
        await SweepController(make_spec(), store, DoubleProvider(), observer=StopAfter(5)).run()
    baseline = tmp_path / "2048" / "raw" / "D4_baseline.json.gz"
    before = baseline.stat().st_mtime_ns
    await SweepController(make_spec(), store, DoubleProvider()).run()
    assert baseline.stat().st_mtime_ns == before
    rec = store.load_record(2048, 4, 8192)
    first = store.load_record(2048, 4, 512)
    assert rec.baseline.tpot_p50_ms == first.baseline.tpot_p50_ms


class StepClock:
    """A deadline clock that moves 1 s every time it is read (a stand-in for elapsed time)."""

    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        self.t += 1.0
        return self.t


async def test_deadline_stops_between_runs_and_keeps_the_engine(tmp_path: Path) -> None:
    provider = DoubleProvider()
    clock = StepClock()
    controller = SweepController(make_spec(), ResultsStore(tmp_path), provider,
                                 deadline=Deadline(at=14.0, margin_s=0.0, clock=clock))
    for kind, key in (("engine_start", (2048,)), ("warmup", (2048,)), ("phase1", (2048, 4)), ("rep", (2048, 0, 512))):
        controller.times.observe(kind, key, 1.0)  # so estimates are small
    report = await controller.run()
    assert report.status == "deadline" and "stopped before" in (report.message or "")
    assert 0 < report.complete_configs < 8
    assert provider.closed[-1] is False
    done = record_set(tmp_path)
    # Every record on disk is whole: no repetition was cut in the middle.
    store = ResultsStore(tmp_path)
    for key in done:
        for r in store.load_record(*key).reps:
            assert (tmp_path / str(key[0]) / r.raw).is_file()
    report = await SweepController(make_spec(), store, DoubleProvider()).run()
    assert report.complete and len(record_set(tmp_path)) == 8
    state = json.loads((tmp_path / "sweep.json").read_text())
    assert [i["status"] for i in state["invocations"]] == ["deadline", "complete"]


async def test_noisy_configs_are_rerun_and_flagged(tmp_path: Path) -> None:
    spec = parse_sweep(
        {
            "grid": {"chunk_sizes": [8192], "decode_batch_sizes": [4], "new_prefill_tokens": [8192]},
            "reps": 3,
            "mode": "fast",
            "cooldown": {"seconds": 0},
            "cv": {"threshold": 0.15, "max_reruns": 1},
            "warmup": {"shapes": False},
        }
    )
    # Injections 2 and 5 of the engine (the second of each attempt) run 3x slower.
    provider = DoubleProvider(make=lambda b: StepEngineDouble(b, noise=lambda k: 3.0 if k in (2, 5) else 1.0))
    report = await SweepController(spec, ResultsStore(tmp_path), provider).run()
    record = ResultsStore(tmp_path).load_record(8192, 4, 8192)
    s = record.summary.model_dump()
    assert len(record.reps) == 6 and s["attempts"] == 2 and s["rerun"] is True
    assert all(cv > 0.15 for cv in s["cv_by_attempt"]) and s["flagged"] is True
    assert report.chunks[8192].flagged == [(8192, 4, 8192)]


async def test_a_clean_rerun_clears_the_flag(tmp_path: Path) -> None:
    spec = parse_sweep({"grid": {"chunk_sizes": [8192], "decode_batch_sizes": [4], "new_prefill_tokens": [8192]},
                        "reps": 3, "mode": "faithful", "cooldown": {"seconds": 0}, "warmup": {"shapes": False}})
    provider = DoubleProvider(make=lambda b: StepEngineDouble(b, noise=lambda k: 3.0 if k == 2 else 1.0))
    await SweepController(spec, ResultsStore(tmp_path), provider).run()
    record = ResultsStore(tmp_path).load_record(8192, 4, 8192)
    s = record.summary.model_dump()
    assert s["attempts"] == 2 and s["flagged"] is False and s["aggregated_reps"] == [3, 4, 5]
    assert s["cv_by_attempt"][1] < 0.15


async def test_fast_mode_reuses_probes(tmp_path: Path) -> None:
    provider = DoubleProvider()
    report = await SweepController(make_spec("fast"), ResultsStore(tmp_path), provider).run()
    # D=4: 2 P x 2 reps = 4 injections per chunk; far fewer probe sets than injections.
    assert report.chunks[2048].probe_sets == 1
    record = ResultsStore(tmp_path).load_record(2048, 4, 8192)
    assert record.config.mode == "fast"


async def test_a_resume_in_the_other_mode_is_refused(tmp_path: Path) -> None:
    store = ResultsStore(tmp_path)
    with pytest.raises(KeyboardInterrupt):
        await SweepController(make_spec("fast"), store, DoubleProvider(), observer=StopAfter(1)).run()
    from pdexporter.errors import ConfigError

    state = (tmp_path / "sweep.json").read_text()
    with pytest.raises(ConfigError, match="recorded with mode='fast'"):
        await SweepController(make_spec("faithful"), store, DoubleProvider()).run()
    assert (tmp_path / "sweep.json").read_text() == state  # the refused sweep wrote nothing (the bad-input audit)


async def test_a_resume_with_other_window_settings_is_refused_before_it_writes(tmp_path: Path) -> None:
    """sweep.json's protocol is what `reanalyse` re-derives the records with: one directory, one protocol."""
    from pdexporter.errors import ConfigError

    store = ResultsStore(tmp_path)
    with pytest.raises(KeyboardInterrupt):
        await SweepController(make_spec(protocol={"after_intervals": 8}), store, DoubleProvider(),
                              observer=StopAfter(1)).run()
    state = (tmp_path / "sweep.json").read_text()
    with pytest.raises(ConfigError, match=r"sweep.json: protocol.after_intervals was 8 for the records already here, "
                                          r"the sweep file says 16; resume with the same protocol"):
        await SweepController(make_spec(protocol={"after_intervals": 16}), store, DoubleProvider()).run()
    assert (tmp_path / "sweep.json").read_text() == state
    report = await SweepController(make_spec(protocol={"after_intervals": 8}), store, DoubleProvider()).run()
    assert report.complete


async def test_a_config_that_keeps_failing_is_skipped_not_fatal(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Probes that never reach the seed's steady state: retried, then skipped; the rest is measured."""
    from pdexporter.measure import protocol

    spec = parse_sweep({"grid": {"chunk_sizes": [2048], "decode_batch_sizes": [4], "new_prefill_tokens": [512, 8192]},
                        "reps": 2, "mode": "fast", "retries": 1, "warmup": {"shapes": False}})
    real_steady = protocol.steady
    calls: dict[str, int] = {}

    def flaky(streams, settings):  # type: ignore[no-untyped-def]
        # The P=512 injections never see a steady window (as jittery probes would).
        return real_steady(streams, settings) and calls["p"] != 512

    original = protocol.run_window

    async def spy(driver, d, p, *args, **kw):  # type: ignore[no-untyped-def]
        calls["p"] = p
        return await original(driver, d, p, *args, **kw)

    import pdexporter.measure.probesets as probesets
    import pdexporter.sweep.controller as controller_mod

    monkeypatch.setattr(probesets, "steady", flaky)
    monkeypatch.setattr(controller_mod, "run_window", spy)
    report = await SweepController(spec, ResultsStore(tmp_path), DoubleProvider()).run()
    assert report.status == "incomplete" and "B=2048 D=4 P=512" in (report.message or "")
    assert report.chunks[2048].failed == [(2048, 4, 512)] and report.chunks[2048].retries == 1
    assert set(record_set(tmp_path)) == {(2048, 4, 8192)}


@pytest.mark.parametrize("order", ["blocked", "interleaved"])
async def test_mixed_shape_warm_up_runs_one_unrecorded_window_per_d_and_p(tmp_path: Path, order: str,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """warmup.mixed: before the first repetition of each (D > 0, P), one window that is not
    recorded (its batch shape, a chunk beside D decodes, then no longer meets vLLM's JIT in a
    measured window)."""
    import collections

    import pdexporter.sweep.controller as controller_mod

    calls: collections.Counter[tuple[int, int]] = collections.Counter()
    original = controller_mod.run_window

    async def spy(driver, d, p, *args, **kw):  # type: ignore[no-untyped-def]
        calls[(d, p)] += 1
        return await original(driver, d, p, *args, **kw)

    monkeypatch.setattr(controller_mod, "run_window", spy)
    spec = parse_sweep(
        {
            "grid": {"chunk_sizes": [2048], "decode_batch_sizes": [0, 4], "new_prefill_tokens": [512, 8192]},
            "reps": 2,
            "mode": "fast",
            "order": {"kind": order, "seed": 1},
            "warmup": {"shapes": False, "mixed": True},
        }
    )
    report = await SweepController(spec, ResultsStore(tmp_path), DoubleProvider()).run()
    assert report.complete
    assert calls == {(0, 512): 2, (0, 8192): 2, (4, 512): 3, (4, 8192): 3}
    for p in (512, 8192):
        assert len(ResultsStore(tmp_path).load_record(2048, 4, p).reps) == 2  # type: ignore[union-attr]


class Messages(SweepObserver):
    def __init__(self) -> None:
        self.lines: list[str] = []

    def on_message(self, text: str) -> None:
        self.lines.append(text)


async def test_a_killed_invocation_is_marked_killed_and_a_resume_says_so(tmp_path: Path) -> None:
    """Issue 24: an invocation killed with SIGKILL left no entry in sweep.json; a resumed sweep said
    nothing about what it found. Now each invocation is written "running" at its start; the next
    one marks a dead one "killed" and prints "resuming: N of M configurations already recorded"."""
    with pytest.raises(KeyboardInterrupt):  # a first run that records some configurations
        await SweepController(make_spec(), ResultsStore(tmp_path), DoubleProvider(), observer=StopAfter(5)).run()
    state = json.loads((tmp_path / "sweep.json").read_text())
    # as a kill -9 leaves it: an entry still "running", of a process that is gone
    state["invocations"].append({"status": "running", "started_at": "2026-01-01T00:00:00+00:00", "pid": 2**22 + 7,
                                 "proc_start": 1})
    (tmp_path / "sweep.json").write_text(json.dumps(state))
    seen = Messages()
    report = await SweepController(make_spec(), ResultsStore(tmp_path), DoubleProvider(), observer=seen).run()
    assert report.complete
    assert "resuming: 2 of 8 configurations already recorded in " + str(tmp_path) in seen.lines
    statuses = [e["status"] for e in json.loads((tmp_path / "sweep.json").read_text())["invocations"]]
    assert statuses == ["interrupted", "killed", "complete"]


async def test_secret_launcher_values_never_reach_sweep_json(tmp_path: Path) -> None:
    """Issue 24: `launcher.vars` values were written in clear; names like DB_CREDS were missed."""
    spec = make_spec(launcher={"kind": "local", "command": "env DSN={db} vllm serve m --hf-auth {creds} "
                                                          "--api-key sk-literal-123 --max-num-batched-tokens {chunk}",
                               "vars": {"DB_CREDS": "hunter2-db", "creds": "pw-creds-456", "db": "pg://u:pw9@db:5432/x",
                                        "model": "qwen"},
                               "env": {"HF_TOKEN": "hf_abcdef"}, "url": "http://127.0.0.1:8000"})
    await SweepController(spec, ResultsStore(tmp_path), DoubleProvider()).run()
    text = (tmp_path / "sweep.json").read_text()
    for secret in ("hunter2-db", "pw-creds-456", "sk-literal-123", "hf_abcdef", "pw9"):
        assert secret not in text, secret
    data = json.loads(text)["spec"]["launcher"]
    assert data["vars"]["DB_CREDS"] == "***" and data["vars"]["model"] == "qwen"
    assert data["vars"]["db"] == "pg://u:***@db:5432/x"


async def test_an_external_engine_has_no_start_up_to_budget_for(tmp_path: Path) -> None:
    """The H200 passive run: `sweep --target URL --deadline 75s` on an engine already serving
    stopped at once, "75 s left, it may take 120 s" (the default start-up estimate), though
    attaching to someone else's engine starts nothing."""
    provider = DoubleProvider(launcher=ExternalLauncher(url="http://engine:8000"))
    spec = parse_sweep({"grid": {**GRID, "chunk_sizes": [8192]}, "reps": 2, "mode": "fast", "cooldown": {"seconds": 0}})
    controller = SweepController(spec, ResultsStore(tmp_path), provider,
                                 deadline=Deadline(at=75.0, margin_s=5.0, clock=lambda: 0.0))
    report = await controller.run()
    assert report.status == "complete" and report.complete_configs == 4 and provider.opened == [8192]
    # A launcher that starts its engine is still held to the start-up estimate.
    stopped = await SweepController(spec, ResultsStore(tmp_path / "local"), DoubleProvider(),
                                    deadline=Deadline(at=75.0, margin_s=5.0, clock=lambda: 0.0)).run()
    assert stopped.status == "deadline" and "starting the engine" in (stopped.message or "")
