# One entry point per user job. Every install path pins torch==2.13.0 first (constraints.txt):
# an unpinned torch pulls a multi-GB CUDA build.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
SCALE  ?= mini
OUT    ?= outputs
# Offline by default on this machine; unset for hub models/tasks.
export HF_HUB_OFFLINE ?= 1
export TOKENIZERS_PARALLELISM ?= false

.PHONY: install test test-slow test-all lint reproduce-table2 table2 prefetch replicas notebooks bench gpu-check clean help

help:
	@echo "make reproduce-table2 [SCALE=mini|rehearsal|paper|tiny] [FORCE=1] [FAULTS=bad-day]  sweep + table"
	@echo "make table2 [SCALE=...]          re-aggregate the table from results files"
	@echo "make prefetch [SCALE=paper] [MIRROR=dir]  on a login node: download what the sweep's jobs load"
	@echo "make replicas MIRROR=dir         offline replicas of the paper's eval datasets (hub layout)"
	@echo "make test | test-slow | lint     tests (fast / slow) and ruff"
	@echo "make notebooks | bench           execute notebooks / run benchmarks"
	@echo "make gpu-check                   paper-shaped step + encode tokens/s + rehearsal row on a GPU (JSON)"

install: $(STAMP)

$(STAMP): pyproject.toml constraints.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet torch==2.13.0
	$(PY) -m pip install --quiet -c constraints.txt -e '.[dev]'
	$(PY) -m ipykernel install --sys-prefix --name python3 >/dev/null
	touch $(STAMP)

test: install
	WANDB_MODE=offline $(PY) -m pytest -q

test-slow: install
	WANDB_MODE=offline $(PY) -m pytest -q -m slow

test-all: install
	WANDB_MODE=offline $(PY) -m pytest -q -m "not gpu and not network"

lint: install
	$(VENV)/bin/ruff check lmk tests benchmarks experiments hydra_plugins
	$(VENV)/bin/lint-imports --no-cache   # the layering contracts of pyproject.toml (docs/architecture.md)

reproduce-table2: install
	$(PY) -m lmk.sweep experiments/table2/spec.yaml --scale $(SCALE) --out $(OUT)/table2/$(SCALE) $(if $(FORCE),--force,) $(if $(FAULTS),--faults $(FAULTS),)

table2: install
	$(PY) -m lmk.tables experiments/table2/spec.yaml --scale $(SCALE) --out $(OUT)/table2/$(SCALE)

# Compute nodes without internet: fetch every model / tokenizer / training file / mteb dataset the sweep's
# jobs load (HF cache, or MIRROR=dir: then run the jobs with hub.mirror=dir or LMK_HUB_MIRROR=dir).
prefetch: install
	$(PY) -m lmk.prefetch experiments/table2/spec.yaml --scale $(SCALE) $(if $(MIRROR),--mirror $(MIRROR),)

replicas: install
	$(PY) -m lmk.eval.replicas --mirror $(or $(MIRROR),$(OUT)/hub-mirror)

notebooks: install
	$(PY) -m lmk.notebooks --out $(OUT)/notebooks --param table2_root=$(abspath $(OUT))/table2 $(if $(THREADS),--threads $(THREADS),)

bench: install
	$(PY) -m benchmarks.run --size full --out $(OUT)/bench

# One JSON report (and $(OUT)/gpu_check/gpu_check.json, read by the cost estimate); skips without CUDA.
gpu-check: install
	$(PY) -m benchmarks.gpu_check --out $(OUT)/gpu_check

clean:
	rm -rf $(OUT) multirun .pytest_cache
