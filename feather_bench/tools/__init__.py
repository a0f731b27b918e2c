"""Helpers shared by the demo, the benchmarks and the end-to-end tests (not loaded by SGLang)."""
