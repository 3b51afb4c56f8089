"""Benchmarks of idivm itself (``idivm bench ...``)."""
