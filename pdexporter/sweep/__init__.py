"""The seed's Phase 3: a grid of (chunk size, D, P) points measured with the engine relaunched per
chunk size, resumable, with a faithful and a fast mode (`docs/sweep.md`).

    spec.py         the sweep file format (pydantic, pure)
    plan.py         what is left to do, CV attempts, run-time estimates (pure)
    launchers.py    local process / Kubernetes launchers, and engine providers (driver per chunk)
    fast.py         fast mode's long-lived probe streams
    controller.py   the loop: engine start, warm-up, Phase 1, Phase 2 x reps, deadline, resume
"""
