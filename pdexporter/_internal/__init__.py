"""Implementation details shared across subsystems; not a public API."""
