"""One interference point: probe streams, prefill injection, window maths, records."""
