"""Talking to an engine: SSE parsing, the HTTP client, /metrics, iteration logs, launchers."""
