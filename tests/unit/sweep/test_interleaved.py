"""Interleaved repetitions (sweep file `order: interleaved`) and engine slots, on
`StepEngineDouble` (a test double): block k holds repetition k of every configuration in the
seeded order recorded in sweep.json and in each repetition; a resumed sweep finishes the block it
was in, in the same order; CV re-run attempts are blocks too; chunk sizes spread over slots."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest
from engine_double import DoubleProvider, StepEngineDouble

from pdexporter.measure.store import ResultsStore
from pdexporter.sweep.controller import Deadline, SweepController, SweepObserver
from pdexporter.sweep.plan import block_order
from pdexporter.sweep.spec import SweepSpec, parse_sweep

GRID = {"chunk_sizes": [2048], "decode_batch_sizes": [0, 2, 4], "new_prefill_tokens": [512, 2048, 8192]}
POINTS = [(d, p) for d in GRID["decode_batch_sizes"] for p in GRID["new_prefill_tokens"]]


def spec(mode: str = "fast", seed: int = 7, **extra: object) -> SweepSpec:
    return parse_sweep({"grid": GRID, "reps": 3, "mode": mode, "cooldown": {"seconds": 0},
                        "order": {"kind": "interleaved", "seed": seed}, "warmup": {"shapes": False}, **extra})


def blocks(root: Path, invocation: int = -1) -> list[dict]:
    state = json.loads((root / "sweep.json").read_text())
    return state["invocations"][invocation]["chunks"]["2048"].get("blocks", [])


class StopAfter(SweepObserver):
    def __init__(self, n: int) -> None:
        self.n, self.seen = n, 0

    def on_rep(self, key, rep, info) -> None:  # type: ignore[no-untyped-def]
        self.seen += 1
        if self.seen == self.n:
            raise KeyboardInterrupt


def test_block_order_is_seeded_complete_and_keeps_each_d_together() -> None:
    a = block_order(42, 8192, 0, POINTS)
    assert sorted(a) == sorted(POINTS) and len(a) == len(POINTS)
    assert a == block_order(42, 8192, 0, POINTS)  # the same draw every time
    others = [block_order(seed, 8192, block, POINTS) for seed, block in ((43, 0), (42, 1), (42, 2))]
    assert any(o != a for o in others)
    runs = [d for d, _ in itertools.groupby(d for d, _ in a)]
    assert len(runs) == len(set(runs)) == 3  # one run of configurations per D


@pytest.mark.parametrize("mode", ["fast", "faithful"])
async def test_every_block_holds_one_repetition_of_every_config_in_the_recorded_order(tmp_path: Path,
                                                                                      mode: str) -> None:
    report = await SweepController(spec(mode), ResultsStore(tmp_path), DoubleProvider()).run()
    assert report.complete
    run = blocks(tmp_path)
    assert [b["block"] for b in run] == [0, 1, 2]
    for b in run:
        assert [tuple(x) for x in b["order"]] == block_order(7, 2048, b["block"], POINTS) == \
            [tuple(x) for x in b["ran"]]
    assert len({json.dumps(b["order"]) for b in run}) > 1  # the order changes from block to block
    store = ResultsStore(tmp_path)
    for d, p in POINTS:
        record = store.load_record(2048, d, p)
        assert [r.rep for r in record.reps] == [0, 1, 2]
        for rep in record.reps:
            extra = rep.model_extra or {}
            assert extra["block"] == rep.rep
            assert run[rep.rep]["order"][extra["block_position"]] == [d, p]
    state = json.loads((tmp_path / "sweep.json").read_text())
    assert state["spec"]["order"] == {"kind": "interleaved", "seed": 7}
    assert state["invocations"][-1]["order"] == {"kind": "interleaved", "seed": 7}


async def test_a_blocked_sweep_records_no_blocks(tmp_path: Path) -> None:
    blocked = spec().model_copy(update={"order": spec().order.model_copy(update={"kind": "blocked"})})
    await SweepController(blocked, ResultsStore(tmp_path), DoubleProvider()).run()
    assert blocks(tmp_path) == []
    record = ResultsStore(tmp_path).load_record(2048, 2, 512)
    assert "block" not in (record.reps[0].model_extra or {})


async def test_an_interrupted_interleaved_sweep_finishes_its_block_in_the_same_order(tmp_path: Path) -> None:
    await SweepController(spec(), ResultsStore(tmp_path / "whole"), DoubleProvider()).run()
    cut = tmp_path / "cut"
    with pytest.raises(KeyboardInterrupt):
        await SweepController(spec(), ResultsStore(cut), DoubleProvider(), observer=StopAfter(11)).run()
    first = blocks(cut)
    assert [b["block"] for b in first] == [0, 1] and len(first[1]["ran"]) == 9
    await SweepController(spec(), ResultsStore(cut), DoubleProvider()).run()
    resumed = blocks(cut)
    # block 1 goes on after the 2 configurations done (the 11th rep was recorded before the interrupt)
    assert resumed[0]["block"] == 1 and resumed[0]["order"] == first[1]["order"]
    assert resumed[0]["ran"] == first[1]["order"][2:]
    assert [b["block"] for b in resumed] == [1, 2]
    whole, again = ResultsStore(tmp_path / "whole"), ResultsStore(cut)
    for d, p in POINTS:
        a, b = whole.load_record(2048, d, p), again.load_record(2048, d, p)
        assert [r.rep for r in b.reps] == [0, 1, 2]
        assert [(r.model_extra or {})["block_position"] for r in a.reps] == \
            [(r.model_extra or {})["block_position"] for r in b.reps]


async def test_cv_reruns_run_as_further_blocks(tmp_path: Path) -> None:
    one = parse_sweep({"grid": {"chunk_sizes": [8192], "decode_batch_sizes": [4], "new_prefill_tokens": [512, 8192]},
                       "reps": 3, "mode": "fast", "order": {"kind": "interleaved", "seed": 1},
                       "cv": {"threshold": 0.15, "max_reruns": 1}, "warmup": {"shapes": False}})
    # Injection 3 (block 1) runs 3x slower: whichever configuration it hits is re-run.
    provider = DoubleProvider(make=lambda b: StepEngineDouble(b, noise=lambda k: 3.0 if k == 3 else 1.0))
    report = await SweepController(one, ResultsStore(tmp_path), provider).run()
    assert report.complete
    state = json.loads((tmp_path / "sweep.json").read_text())
    run = state["invocations"][-1]["chunks"]["8192"]["blocks"]
    assert [b["block"] for b in run] == [0, 1, 2, 3, 4, 5]
    rerun = [tuple(x) for x in run[3]["ran"]]
    assert len(rerun) == 1 and all([list(rerun[0])] == b["ran"] for b in run[3:])
    record = ResultsStore(tmp_path).load_record(8192, *rerun[0])
    assert [(r.model_extra or {})["block"] for r in record.reps] == [0, 1, 2, 3, 4, 5]
    assert record.summary.model_dump()["attempts"] == 2


async def test_chunk_sizes_spread_over_engine_slots(tmp_path: Path) -> None:
    grid = {"chunk_sizes": [1024, 2048, 4096], "decode_batch_sizes": [0, 2], "new_prefill_tokens": [512, 2048]}
    multi = parse_sweep({"grid": grid, "reps": 2, "mode": "fast", "warmup": {"shapes": False}})
    slots = [DoubleProvider(), DoubleProvider()]
    report = await SweepController(multi, ResultsStore(tmp_path), slots).run()
    assert report.complete and report.complete_configs == 12
    assert sorted(slots[0].opened + slots[1].opened) == [1024, 2048, 4096]
    assert slots[0].opened and slots[1].opened  # both engines worked
    assert len(list(ResultsStore(tmp_path).iter_records())) == 12  # one results directory


class StepClock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        self.t += 1.0
        return self.t


async def test_each_slot_stops_at_the_deadline_and_a_rerun_completes(tmp_path: Path) -> None:
    grid = {"chunk_sizes": [1024, 2048, 4096], "decode_batch_sizes": [0, 2], "new_prefill_tokens": [512, 2048]}
    multi = parse_sweep({"grid": grid, "reps": 2, "mode": "fast", "warmup": {"shapes": False}})
    slots = [DoubleProvider(), DoubleProvider()]
    controller = SweepController(multi, ResultsStore(tmp_path), slots, deadline=Deadline(at=30.0, margin_s=0.0,
                                                                                         clock=StepClock()))
    for kind, key in (("engine_start", (1024,)), ("warmup", (1024,)), ("phase1", (1024, 2)), ("rep", (1024, 0, 512))):
        controller.times.observe(kind, key, 1.0)
    report = await controller.run()
    assert report.status == "deadline" and 0 < report.complete_configs < 12
    assert any(s.closed and s.closed[-1] is False for s in slots)  # an engine in use is kept for the rerun
    report = await SweepController(multi, ResultsStore(tmp_path), [DoubleProvider(), DoubleProvider()]).run()
    assert report.complete and report.complete_configs == 12
