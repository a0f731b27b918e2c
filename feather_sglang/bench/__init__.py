"""Benchmarks of feather against SGLang's own code (run through ``scripts/``)."""
