# feather-sglang: `make demo` and `make test` set everything up on a fresh machine.
PYTHON := .venv/bin/python
PYTEST_ARGS ?=

.PHONY: rl-zoo setup env models demo test test-fast bench-overhead bench-overhead-quick bench-attention bench-dtype clean-models help gpu-check ab ab-quick patch-check bench-serving

help:
	@echo "make demo   - set up, then serve the default model with --schedule-policy feather and print throughput"
	@echo "make test   - set up, then run the whole test suite (unit, SGLang objects, real servers)"
	@echo "make test-fast - unit and SGLang-object tests only (no servers)"
	@echo "make setup  - .venv/ and models/ only"
	@echo "make bench-overhead[-quick] - scheduling cost per pass: feather vs SGLang's lpm / dfs-weight"
	@echo "make bench-serving - sglang.bench_serving against fcfs/lpm/dfs-weight/feather x both backends (results/bench_serving/)"
	@echo "make bench-dtype - which --dtype serves fastest on this CPU"
	@echo "make bench-attention - --attention-backend feather vs torch_native: kernel step and real server"
	@echo "make ab     - feather-ab on every built-in workload and the example workload file (results/ab/)"
	@echo "make ab-quick - feather-ab on the example workload file only (a few minutes)"
	@echo "make patch-check [SGLANG_TREE=dir] - does patches/ apply to that sglang (default: .venv's)? changes nothing"
	@echo "make bench-dp - 2 data-parallel feather workers: prefix_group vs round_robin routing (results/dp/)"
	@echo "make bench-router - 2 feather servers behind sglang-router: cache_aware vs round_robin (results/router/)"
	@echo "make bench-dp-router - bench-dp then bench-router, back to back (docs/scale-out.md compares them)"
	@echo "make bench-abort-storm - a live feather server under 10 cycles of 1,000 requests, 30% of clients giving up (results/reliability/)"
	@echo "make rl-zoo - rl-zoo3 (in .venv-zoo) trains 1,000 steps from feather_rl/hyperparams/ppo.yml; the model becomes a policy file (logs/)"
	@echo "make bench-scaleout-sim - routers x 4-64 workers, projected in the simulator (results/scaleout/)"

setup: env models

env:
	@bash scripts/setup_env.sh

models: env
	@$(PYTHON) -m feather_bench.setup_models

demo: setup
	$(PYTHON) -m feather_bench.demo

test: setup
	@bash scripts/setup_zoo_env.sh || echo "setup: no .venv-zoo (rl-zoo3 could not be installed); its test is skipped"
	$(PYTHON) -m pytest $(PYTEST_ARGS)

test-fast: setup
	$(PYTHON) -m pytest -m "not e2e" $(PYTEST_ARGS)

bench-overhead: setup
	$(PYTHON) -m feather_bench.overhead --json results/bench_overhead.json
	.venv/bin/feather-bench-scale --waiting 10000,50000 --json results/scale/scale.json

bench-overhead-quick: setup
	$(PYTHON) -m feather_bench.overhead --quick --json results/bench_overhead_quick.json

bench-attention: setup
	$(PYTHON) -m feather_bench.attention --extend --server --json results/bench_attention.json

# feather-ab: every policy x attention backend on each built-in workload, then the example
# workload file online (Poisson arrivals from the file). One torch thread per SGLang run keeps
# the timings stable on a small shared machine (see README).
AB_ARGS ?= --threads 1
AB_AGENT_PPO := ppo:feather_rl/agents/ppo_serving.zip
# Workloads are named by their shape, gGROUPSxREQUESTS-pPREFIX-qQUESTION (SPECS and ALIASES in
# feather_bench/workloads.py; the result files keep the old names: feather-8x100 = g8x8-p2000-q24,
# feather-8x100-p400 = g8x8-p400-q24, feather-8x50 = g8x50-p400-q24, batchllm = g4x16-p2000-q200,
# batchllm-half = g4x8-p1000-q100). The 400-token and halved shapes serve the agents, the 64-token
# and the small-pool variants (a 4,096-token pool cannot hold one group's 2,000-token prefix and
# its 16 requests; a 2,048 one no 2,000-token prompts).
ab: setup
	.venv/bin/feather-ab --workload g8x8-p2000-q24 --feather-agents static,$(AB_AGENT_PPO) --repeats 2 --json results/ab/feather-8x100.json $(AB_ARGS)
	.venv/bin/feather-ab --workload g8x8-p400-q24 --feather-agents static,$(AB_AGENT_PPO) --repeats 2 --json results/ab/feather-8x100-p400.json $(AB_ARGS)
	.venv/bin/feather-ab --workload g4x16-p2000-q200 --feather-agents static,$(AB_AGENT_PPO) --json results/ab/batchllm.json $(AB_ARGS)
	.venv/bin/feather-ab --workload g4x8-p1000-q100 --feather-agents static,$(AB_AGENT_PPO) --json results/ab/batchllm-half.json $(AB_ARGS)
	.venv/bin/feather-ab --workload no-sharing --repeats 2 --json results/ab/no-sharing.json $(AB_ARGS)
	@for w in multilevel gsp; do .venv/bin/feather-ab --workload $$w --json results/ab/$$w.json $(AB_ARGS) || exit 1; done
	.venv/bin/feather-ab --workload g8x8-p400-q24 --policies feather --backends feather --feather-agents static,ucb,qlearning,$(AB_AGENT_PPO) --json results/ab/agents-feather-8x100-p400.json $(AB_ARGS)
	.venv/bin/feather-ab --workload-file scripts/example_workload.jsonl --mode online --json results/ab/example-online.json $(AB_ARGS)
	.venv/bin/feather-ab --workload g8x8-p400-q24 --max-new-tokens 64 --json results/ab/feather-8x100-p400-out64.json $(AB_ARGS)
	.venv/bin/feather-ab --workload g8x50-p400-q24 --repeats 2 --json results/ab/feather-8x50.json $(AB_ARGS)
	.venv/bin/feather-ab --workload g4x8-p1000-q100 --max-total-tokens 4096 --json results/ab/batchllm-half-kv4096.json $(AB_ARGS)
	.venv/bin/feather-ab --workload g8x8-p400-q24 --max-total-tokens 2048 --json results/ab/feather-8x100-p400-kv2048.json $(AB_ARGS)
	.venv/bin/feather-ab --workload g8x50-p400-q24 --max-total-tokens 2048 --json results/ab/feather-8x50-kv2048.json $(AB_ARGS)

ab-quick: setup
	.venv/bin/feather-ab --workload-file scripts/example_workload.jsonl --policies fcfs,lpm,feather --json results/ab/example-offline.json $(AB_ARGS)

# SGLang's own client (python -m sglang.bench_serving) against one server per configuration
BENCH_SERVING_ARGS ?= --workloads memory-ample,memory-bound-cpu,no-sharing-cpu --repeats 2
bench-serving: setup
	.venv/bin/feather-bench-serving --model models/SmolLM2-135M-Instruct $(BENCH_SERVING_ARGS)
	$(PYTHON) -m feather_bench.docs

bench-dtype: setup
	$(PYTHON) -m feather_bench.dtype --json results/bench_dtype.json

# On a machine with an NVIDIA GPU (no setup: a GPU host's python3 holds CUDA torch; .venv's is CPU)
gpu-check:
	bash scripts/gpu_check.sh

# patches/: whether the fork patch applies to an sglang tree (the directory holding sglang/)
SGLANG_TREE ?= $(shell $(PYTHON) -c "import os, sglang; print(os.path.dirname(os.path.dirname(sglang.__file__)))" 2>/dev/null)
patch-check: setup
	$(PYTHON) -m feather_bench.patch_sglang "$(SGLANG_TREE)" --check

clean-models:
	rm -rf models

# ---- learning agents (feather_rl): train, evaluate, record real measurements for replay ------
.PHONY: train eval record
TRAIN_ARGS ?= --algo ppo --timesteps 300000 --n-envs 4 --seed 0 --out results/runs/ppo-seed0
EVAL_ARGS ?=
RECORD_ARGS ?= --repeats 3 --out results/replay_tiny-llama.json

train: setup
	OMP_NUM_THREADS=1 .venv/bin/feather-train $(TRAIN_ARGS)

eval: setup
	OMP_NUM_THREADS=1 .venv/bin/feather-eval --seeds 10 --json results/rl/eval_serving.json $(EVAL_ARGS)

record: setup
	OMP_NUM_THREADS=1 .venv/bin/feather-record $(RECORD_ARGS)

# rl-zoo3 in an environment of its own (its dependencies conflict with the serving set), the
# command docs/rl.md gives, then the model it writes as a policy file the server loads.
rl-zoo: setup
	@bash scripts/setup_zoo_env.sh
	.venv-zoo/bin/python -m rl_zoo3.train --algo ppo --env feather/Serving-v0 --gym-packages feather_rl \
	    --conf-file feather_rl/hyperparams/ppo.yml -n 1000 --log-folder logs
	$(PYTHON) -m feather_rl.policy_file $$(ls -td logs/ppo/feather-Serving-v0_*/ | head -1)feather-Serving-v0.zip logs/zoo-policy.zip
	.venv/bin/feather-eval --agents static,always-add,ppo:logs/zoo-policy.zip --seeds 1

# Data-parallel scale-out projected in the simulator: routers x 4-64 workers (docs/scale-out.md)
.PHONY: bench-scaleout-sim
SCALEOUT_ARGS ?=
bench-scaleout-sim: setup
	OMP_NUM_THREADS=1 $(PYTHON) -m feather_rl.scaleout --costs feather_rl/data/step_costs_cpu_xeon-2.8ghz.json \
		--json results/scaleout/projection.json $(SCALEOUT_ARGS)

# Two data-parallel feather workers on this host, SGLang's round robin against prefix_group
# routing, measured with sglang.bench_serving (docs/scale-out.md)
.PHONY: bench-dp bench-router bench-dp-router bench-abort-storm
bench-dp: setup
	.venv/bin/feather-bench-dp --model models/SmolLM2-135M-Instruct --attention-backend feather --json results/dp/dp.json

# The same workload and client as bench-dp, through sglang-router in front of separate servers
bench-router: setup
	.venv/bin/feather-bench-router --model models/SmolLM2-135M-Instruct --server-args "--attention-backend feather" --json results/router/router.json

# Both deployments back to back, for the side-by-side table in docs/scale-out.md
bench-dp-router: bench-dp bench-router

# A live feather server under clients that give up, reused rids and a small queue cap
# (docs/reliability.md)
bench-abort-storm: setup
	.venv/bin/feather-bench-abort-storm --model models/tiny-llama --server-args "--dtype float32" --json results/reliability/abort_storm.json
