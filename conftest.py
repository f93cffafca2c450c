# Keeps the repository root importable for `python -m pytest` from any checkout or worktree.
