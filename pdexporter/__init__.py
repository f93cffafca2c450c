"""pdexporter: prefill/decode interference, measured on a live vLLM and exported.

The public surface is small on purpose: the CLI (`pdexporter ...`), the record schema
(`pdexporter.measure.records`) and the pure window maths (`pdexporter.measure.window`).
Everything else is implementation that may move.
"""

__version__ = "0.1.0"
