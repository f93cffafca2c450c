"""`pdexporter doctor`: what the numbers will rest on, checked before measuring.

`checks` (pure) judges what `gather` (the I/O edge) saw: engine reachable, its version and
adapter, the model and its max_model_len, a streamed completion, the chunk size (given or
assumed), the step log (exact chunk steps, or estimated from the cadence), prefix caching,
CUDA-graph capture, and the Prometheus and OTLP endpoints. `job` is the command: options, gather,
judge, the verdicts as a table.
"""

from pdexporter.doctor.checks import Check, EndpointFacts, EngineFacts, Status, evaluate, failed

__all__ = ["Check", "EndpointFacts", "EngineFacts", "Status", "evaluate", "failed"]
