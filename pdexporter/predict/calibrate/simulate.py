"""Configurations predicted by running the measurement protocol on the embedded engine: the
`Simulator` protocol and `RecordSimulator` (whole (B, D) groups, cached by profile, in worker processes)."""

from __future__ import annotations

import contextlib
import hashlib
import os
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable, Collection, Iterable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from pdexporter.engines import DEFAULT_ENGINE, imitation_for
from pdexporter.measure.records import RunRecord
from pdexporter.predict.calibrate.holdout import PointFigures
from pdexporter.predict.calibrate.params import Key
from pdexporter.sim.profile import Profile

if TYPE_CHECKING:
    from concurrent.futures import ProcessPoolExecutor

    from pdexporter.measure.protocol import ProtocolSettings

__all__ = [
    "Group",
    "RecordSimulator",
    "Simulator",
    "imitation_of",
    "profile_fingerprint",
    "simulate_group",
]


# -- simulating configurations: the protocol on the embedded engine ------------------------------

class Simulator(Protocol):
    """Predicts configurations' figures with profiles by running the protocol on the embedded engine."""

    def __call__(self, profiles: Sequence[Profile], keys: Collection[Key]) -> list[dict[Key, PointFigures]]:
        """One prediction of `keys` per profile, in order."""
        ...

    def batch(self, requests: Sequence[tuple[Profile, Collection[Key]]]) -> list[dict[Key, PointFigures]]:
        """One prediction per (profile, keys) request, in order, run side by side."""
        ...

    def groups(self, keys: Collection[Key]) -> int:
        """How many units of work (simulated groups) one profile's prediction of `keys` takes."""
        ...

    @property
    def simulated(self) -> int:
        """Units of work run so far (cache hits excluded)."""
        ...


Group = tuple[int, int]  # (chunk_size, D): what one engine simulates independently of the others


def profile_fingerprint(profile: Profile) -> str:
    """What decides a simulation's result (names and notes do not)."""
    text = profile.model_dump_json(include={"gpu", "model", "engine", "step_time", "engine_loop"})
    return hashlib.sha256(text.encode()).hexdigest()


@contextlib.contextmanager
def _scratch_in_memory() -> Iterator[None]:
    """Point tempfile at /dev/shm while simulating: the predicted records are written (fsync'd) to a
    scratch directory and thrown away, and on tmpfs that costs nothing (~15 % of a simulation on disk)."""
    shm = Path("/dev/shm")
    if not (shm.is_dir() and os.access(shm, os.W_OK)):
        yield
        return
    saved = tempfile.tempdir
    tempfile.tempdir = str(shm)
    try:
        yield
    finally:
        tempfile.tempdir = saved


def simulate_group(profile: Profile, settings: ProtocolSettings, mode: str, chunk_size: int, d: int,
                   prefills: Sequence[int], imitates: str = DEFAULT_ENGINE) -> tuple[dict[Key, PointFigures], float]:
    """One (B, D) group predicted (`predict.grid.predict_records`) on the embedded engine imitating
    `imitates`, and the CPU seconds it took."""
    from pdexporter.predict.grid import predict_records

    t0 = time.process_time()
    with _scratch_in_memory():
        records = predict_records(profile, [(chunk_size, d, p) for p in prefills], settings, mode=mode,
                                  imitates=imitates)
    return {key: PointFigures.of(r) for key, r in records.items()}, time.process_time() - t0


def _simulate_group_task(args: tuple[Profile, ProtocolSettings, str, int, int, tuple[int, ...], str]
                         ) -> tuple[dict[Key, PointFigures], float]:
    return simulate_group(*args)


class RecordSimulator:
    """`Simulator` over a fixed set of configurations (`universe`, the records' keys).

    Every prediction runs whole (B, D) groups, each on its own engine as a sweep restarts vLLM per
    chunk size (the groups are independent: run apart or together they agree to 1e-6), with all of
    the group's prefill sizes in the universe, whatever subset was asked for; results are cached by
    profile fingerprint and group, so any later subset at the same parameters costs nothing. With
    `jobs` > 1 the groups of all the profiles asked for at once (a Jacobian's columns) run in that
    many worker processes, longest first. `on_group(group)` is called as each group is done (also
    for a cached one), for progress bars. `imitates`: the engine (setup) the embedded engine imitates,
    the records' (`imitation_of`; None: `calibrate` sets it from its records, else vLLM's), so that
    SGLang's records are predicted on SGLang's scheduling.
    """

    def __init__(self, universe: Iterable[Key], settings: ProtocolSettings, *, mode: str = "fast", jobs: int = 1,
                 on_group: Callable[[Group], None] | None = None, imitates: str | None = None) -> None:
        self.imitates = imitates
        by_group: dict[Group, set[int]] = defaultdict(set)
        for b, d, p in universe:
            by_group[(b, d)].add(p)
        self.prefills: dict[Group, tuple[int, ...]] = {g: tuple(sorted(ps)) for g, ps in sorted(by_group.items())}
        self.settings = settings
        self.mode = mode
        self.jobs = max(1, jobs)
        self.on_group = on_group
        self.cache: dict[tuple[str, Group], dict[Key, PointFigures]] = {}
        self.cost: dict[Group, float] = {}  # CPU seconds of the last run of each group
        self._simulated = 0  # groups run (cache misses)
        self.cpu_s = 0.0
        self._pool: ProcessPoolExecutor | None = None

    def _groups_of(self, keys: Collection[Key]) -> list[Group]:
        wanted = sorted({(b, d) for b, d, _ in keys})
        unknown = [g for g in wanted if g not in self.prefills]
        if unknown:
            raise ValueError(f"configurations outside the records: B={unknown[0][0]} D={unknown[0][1]}")
        return wanted

    def groups(self, keys: Collection[Key]) -> int:
        return len(self._groups_of(keys))

    @property
    def simulated(self) -> int:
        return self._simulated

    def __call__(self, profiles: Sequence[Profile], keys: Collection[Key]) -> list[dict[Key, PointFigures]]:
        return self.batch([(p, keys) for p in profiles])

    def batch(self, requests: Sequence[tuple[Profile, Collection[Key]]]) -> list[dict[Key, PointFigures]]:
        wanted_groups = [self._groups_of(keys) for _, keys in requests]
        prints = [profile_fingerprint(p) for p, _ in requests]
        todo: dict[tuple[str, Group], Profile] = {}
        for (profile, _), fp, groups in zip(requests, prints, wanted_groups):
            for g in groups:
                if (fp, g) in self.cache:
                    if self.on_group is not None:
                        self.on_group(g)
                elif (fp, g) not in todo:
                    todo[(fp, g)] = profile
        # longest first (the last run's cost, else the number of prefills): the workers finish together
        order = sorted(todo, key=lambda item: -self.cost.get(item[1], 0.1 * len(self.prefills[item[1]])))
        for item, (figures, cpu) in self._run([(todo[item], item[1]) for item in order], order):
            self.cache[item] = figures
            self.cost[item[1]] = cpu
            self.cpu_s += cpu
            self._simulated += 1
            if self.on_group is not None:
                self.on_group(item[1])
        out = []
        for (_, keys), fp, groups in zip(requests, prints, wanted_groups):
            wanted = set(keys)
            merged: dict[Key, PointFigures] = {}
            for g in groups:
                merged.update({k: v for k, v in self.cache[(fp, g)].items() if k in wanted})
            out.append(merged)
        return out

    def _run(self, tasks: list[tuple[Profile, Group]], items: list[tuple[str, Group]]
             ) -> Iterator[tuple[tuple[str, Group], tuple[dict[Key, PointFigures], float]]]:
        args = [(profile, self.settings, self.mode, g[0], g[1], self.prefills[g], self.imitates or DEFAULT_ENGINE)
                for profile, g in tasks]
        if self.jobs == 1 or len(args) <= 1:
            for item, a in zip(items, args):
                yield item, _simulate_group_task(a)
            return
        from concurrent.futures import as_completed

        pool = self._executor()
        futures = {pool.submit(_simulate_group_task, a): item for item, a in zip(items, args)}
        for future in as_completed(futures):
            yield futures[future], future.result()

    def _executor(self) -> ProcessPoolExecutor:
        if self._pool is None:
            import multiprocessing
            from concurrent.futures import ProcessPoolExecutor

            # spawn: the parent may run a progress bar's thread, which fork would copy mid-flight
            self._pool = ProcessPoolExecutor(self.jobs, mp_context=multiprocessing.get_context("spawn"))
        return self._pool

    def imitate(self, engine: str) -> None:
        """Simulate imitating `engine` (the records'): refused once it has simulated another."""
        if self.imitates not in (None, engine) and self.cache:
            raise ValueError(f"this simulator imitated {self.imitates}; the records are {engine}'s")
        self.imitates = engine

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(cancel_futures=True)
            self._pool = None

    def __enter__(self) -> RecordSimulator:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def imitation_of(records: Iterable[RunRecord]) -> str:
    """The engine (setup) the embedded engine imitates to predict these records (their
    `config.engine`'s, `engines.imitation_for`); ValueError for records of engines it would imitate
    differently (calibrate them apart)."""
    found = sorted({imitation_for(r.config.engine) for r in records})
    if len(found) > 1:
        raise ValueError(f"records of engines scheduled differently ({', '.join(found)}): calibrate them apart")
    return found[0] if found else DEFAULT_ENGINE


def _imitate_records(simulate: Simulator | None, records: Sequence[RunRecord]) -> None:
    """Tell a simulator that can imitate engines (a `RecordSimulator`) the records' engine."""
    imitate = getattr(simulate, "imitate", None)
    if imitate is not None:
        imitate(imitation_of(records))
