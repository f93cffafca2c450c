"""Records from the embedded engine for the analysis' integration tests (imported by name: unique)."""

from __future__ import annotations

from pathlib import Path


def sim_records(grid: list[tuple[int, int, int]], reps: int, out: Path,
                profile: str = "h200-qwen3-coder-30b-a3b") -> list:
    """Records measured on the embedded engine (SimDriver) on virtual time: the real protocol,
    window maths and record code, against the engine's modelled step times. Seconds, not hours."""
    from pdexporter._internal.vloop import run_virtual
    from pdexporter.measure.point import PointSpec, measure_point
    from pdexporter.measure.protocol import ProtocolSettings, warm_prefix
    from pdexporter.measure.store import ResultsStore
    from pdexporter.sim.driver import SimDriver

    settings = ProtocolSettings()
    store = ResultsStore(out)

    async def sweep() -> list:
        records = []
        for b in sorted({g[0] for g in grid}):
            async with SimDriver.create(profile=profile, chunk_size=b) as driver:
                await warm_prefix(driver, settings)
                for chunk, d, p in grid:
                    if chunk == b:
                        records.append(await measure_point(driver, PointSpec(b, d, p), settings, store, reps=reps))
        return records

    return run_virtual(sweep())
