"""The seed's Phase 3: a grid of (chunk size, D, P) points measured with the engine relaunched per
chunk size, resumable, with a faithful and a fast mode, blocked or interleaved repetitions, and
chunk sizes side by side on several engines (one per GPU) (`docs/sweep.md`).

    spec.py         the sweep file format (pydantic, pure)
    plan.py         what is left to do, CV attempts, the interleaved block order, run-time estimates (pure)
    controller.py   the loop: engine slots, engine start, warm-up, Phase 1, Phase 2 x reps, deadline, resume
    job.py          `pdexporter sweep` / `sim sweep`: the file with the command line over it, the run, its outcome

Launchers and the providers that give the controller a driver per chunk size are in
`pdexporter.launch`; fast mode's long-lived probe streams are `measure.probesets.PooledProbes`.
"""
