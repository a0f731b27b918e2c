# feather-sglang: `make demo` and `make test` set everything up on a fresh machine.
PYTHON := .venv/bin/python
PYTEST_ARGS ?=

.PHONY: setup env models demo test test-fast clean-models help

help:
	@echo "make demo   - set up, then serve the default model with --schedule-policy feather and print throughput"
	@echo "make test   - set up, then run the whole test suite (unit, SGLang objects, real servers)"
	@echo "make test-fast - unit and SGLang-object tests only (no servers)"
	@echo "make setup  - .venv/ and models/ only"

setup: env models

env:
	@bash scripts/setup_env.sh

models: env
	@$(PYTHON) scripts/setup_models.py

demo: setup
	$(PYTHON) scripts/demo.py

test: setup
	$(PYTHON) -m pytest $(PYTEST_ARGS)

test-fast: setup
	$(PYTHON) -m pytest -m "not e2e" $(PYTEST_ARGS)

clean-models:
	rm -rf models
