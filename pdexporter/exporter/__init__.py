"""The live exporter: probe streams, periodic prefill windows, Prometheus metrics, OTel spans."""
