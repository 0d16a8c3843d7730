# One entry point per user job. Every install path installs torch==2.13.0 first, then the full lock
# (requirements.lock, CPU torch; `make lock` refreshes it from constraints.txt + pyproject.toml):
# an unpinned torch pulls a multi-GB CUDA build.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
SCALE  ?= mini
OUT    ?= outputs
# Jobs run offline by default (compute nodes have no internet): HF_HUB_OFFLINE=1 unless the caller sets it
# (`HF_HUB_OFFLINE= make ...` runs online). `make download` downloads, so it runs online by default (a login
# node); `HF_HUB_OFFLINE=1 make download` only records what is on disk. (`make prefetch`: its old name.)
ifeq ($(origin HF_HUB_OFFLINE),undefined)
HF_HUB_OFFLINE := 1
download prefetch: HF_HUB_OFFLINE :=
endif
export HF_HUB_OFFLINE
export TOKENIZERS_PARALLELISM ?= false

.PHONY: install lock test test-slow test-all test-node test-slurm slurm-up slurm-down slurm-status lint reproduce-table2 table2 download prefetch replicas notebooks bench gpu-check wheelhouse rehearse-nodes clean help

help:
	@echo "make reproduce-table2 [SCALE=mini|rehearsal|paper|tiny] [FORCE=1] [FAULTS=bad-day] [LAUNCHER=submitit_slurm] [THROUGHPUT=json]  sweep + table"
	@echo "make table2 [SCALE=...]          re-aggregate the table from results files"
	@echo "make download [SCALE=paper] [MIRROR=dir]  on a login node: download what the sweep's jobs load"
	@echo "make replicas MIRROR=dir         offline replicas of the paper's eval datasets (hub layout)"
	@echo "make test | test-slow | lint     tests (fast / slow) and ruff"
	@echo "make lock                        refresh requirements.lock (the full pinned environment)"
	@echo "make notebooks [SCALE=...] | bench  execute notebooks (best sweep present, or SCALE's) / benchmarks"
	@echo "make rehearse-nodes [NODES=2]    one rehearsal row as a multi-node SLURM job on this machine"
	@echo "make slurm-up | slurm-down | slurm-status  a real 2-node SLURM cluster here (root, Debian); test-slurm"
	@echo "make gpu-check [PYTHON=python3] [WHEELHOUSE=archive]  paper-shaped step + encode tokens/s + rehearsal row"
	@echo "                                 on a GPU (JSON), on the node's own Python; installs nothing (docs/gpu-node.md)"
	@echo "make wheelhouse [NODE=freeze.txt] [NODE_PYTHON=3.12] [GROUP=full|light]  one archive of what a GPU node lacks"
	@echo "make test-node                   the GPU node simulated: its packages + the archive, no network (slow)"

install: $(STAMP)

$(STAMP): pyproject.toml requirements.lock
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet torch==2.13.0
	$(PY) -m pip install --quiet -c requirements.lock -e '.[dev]'
	$(PY) -m ipykernel install --sys-prefix --name python3 >/dev/null
	touch $(STAMP)

# The fast suite runs on every core (pytest-xdist: each test goes to the next free worker, except that a module
# sharing a module-scoped fixture stays on one worker, which builds it once; tests/conftest.py gives each worker
# its share of the cores as torch threads); WORKERS=1 runs it in one process. The slow suite (end to end: the
# tests the fast one leaves out for time) runs the same way: on 2 cores its 33 tests of then took 20 min on two
# workers against 35 in one (its DDP ranks, fault timeouts and jobs pass as in one process); 63 tests take 22 min
# (beside the scheduler tests, on an AVX-512 EPYC).
WORKERS ?= auto
# Bytecode on for the tests, where a machine turns it off (PYTHONDONTWRITEBYTECODE=1, as some container images do):
# pytest then rewrites the asserts of every test module again in each worker, about 9 s a process here.
PYTEST  := WANDB_MODE=offline PYTHONDONTWRITEBYTECODE= $(PY) -m pytest
XDIST   := $(if $(filter 1,$(WORKERS)),-p no:xdist,-n $(WORKERS) --dist loadgroup)
test: install
	$(PYTEST) -q $(XDIST)

test-slow: install
	$(PYTEST) -q -m slow $(XDIST)

# The scheduler tests (requeue, time limits, node loss on the real scheduler) on the local cluster.
test-slurm: install slurm-up
	$(PYTEST) -q -m slurm

test-all: install
	$(PYTEST) -q -m "not gpu and not network and not slurm" $(XDIST)

# Refresh the lock: a fresh resolution of torch==2.13.0 + constraints.txt + .[dev] (nothing is installed),
# then `make install` on a new venv installs exactly it. Commit requirements.lock with the change.
lock:
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet --dry-run --ignore-installed --report $(VENV)/lock-report.json \
		torch==2.13.0 -c constraints.txt -e '.[dev]'
	$(PY) lmk/run/environment.py lock $(VENV)/lock-report.json requirements.lock

lint: install
	$(VENV)/bin/ruff check lmk tests benchmarks experiments hydra_plugins tools
	$(VENV)/bin/lint-imports --no-cache   # the layering contracts of pyproject.toml (docs/architecture.md)

reproduce-table2: install
	$(PY) -m lmk.sweep experiments/table2/spec.yaml --scale $(SCALE) --out $(OUT)/table2/$(SCALE) $(if $(FORCE),--force,) $(if $(THROUGHPUT),--throughput $(THROUGHPUT),) $(if $(FAULTS),--faults $(FAULTS),) $(if $(LAUNCHER),--launcher $(LAUNCHER),)

table2: install
	$(PY) -m lmk.tables experiments/table2/spec.yaml --scale $(SCALE) --out $(OUT)/table2/$(SCALE)

# Compute nodes without internet: fetch every model / tokenizer / training file / mteb dataset the sweep's
# jobs load (HF cache, or MIRROR=dir: then run the jobs with hub.mirror=dir or LMK_HUB_MIRROR=dir).
download: install
	$(PY) -m lmk.download experiments/table2/spec.yaml --scale $(SCALE) $(if $(MIRROR),--mirror $(MIRROR),)

prefetch: download  # the old name, kept working
	@echo "make prefetch is deprecated: use make download" >&2

replicas: install
	$(PY) -m lmk.eval.replicas --mirror $(or $(MIRROR),$(OUT)/hub-mirror)

# The notebook analyses the most meaningful sweep present (paper > mini > rehearsal > tiny); SCALE=... on the
# command line (or in the environment) names one instead (SCALE's default `mini` is for the sweep targets).
NB_SCALE := $(if $(filter command line environment,$(origin SCALE)),--param scale=$(SCALE),)
notebooks: install
	$(PY) -m lmk.notebooks --out $(OUT)/notebooks --param table2_root=$(abspath $(OUT))/table2 $(NB_SCALE) $(if $(THREADS),--threads $(THREADS),)

bench: install
	$(PY) -m benchmarks.run --size full --out $(OUT)/bench

# One JSON report (and $(OUT)/gpu_check/gpu_check.json, read by the cost estimate); without CUDA it prints a skip
# and writes nothing (`python -m benchmarks.gpu_check --cpu-smoke` writes cpu_check.json: THROUGHPUT=... for a CPU scale).
# GPU nodes bring their own Python and often no registry: it runs on PYTHON as given (the node's python3; else this
# checkout's .venv when there is one), installs nothing and never touches torch. WHEELHOUSE=archive (from
# `make wheelhouse`) unpacks what the node lacks into a temporary folder on the path for that run (docs/gpu-node.md).
CHECK_PY := $(if $(filter command line environment,$(origin PYTHON)),$(PYTHON),$(if $(wildcard $(PY)),$(PY),$(PYTHON)))
gpu-check:
	$(CHECK_PY) -m benchmarks.gpu_check --out $(OUT)/gpu_check $(if $(WHEELHOUSE),--wheelhouse $(WHEELHOUSE),) $(if $(SECTIONS),--sections $(SECTIONS),) $(if $(SMOKE),--cpu-smoke,)

# On a machine with a registry: one tar.xz of exactly what a GPU node lacks (an installed --target folder), for the
# node's Python and platform, from the node's package list (NODE: `pip freeze` there; several files: later ones
# override). GROUP=light packs only what the model sections need. Stubs, built wheels and pip's cache stay in
# .wheelhouse/ (ignored). The archive is printed with its size and contents; over MAX_MIB MiB it is refused.
NODE        ?= benchmarks/nodes/h200.txt
NODE_PYTHON ?= 3.12
GROUP       ?= full
MAX_MIB     ?= 55
XZ_PRESET   ?= 9
WHEELHOUSE_OUT ?= .wheelhouse/lmk-$(basename $(notdir $(firstword $(NODE))))-cp$(subst .,,$(NODE_PYTHON))$(if $(filter light,$(GROUP)),-light,).tar.xz
wheelhouse:
	PIP_CACHE_DIR=$${PIP_CACHE_DIR:-$(CURDIR)/.wheelhouse/pip-cache} $(PYTHON) -m benchmarks.wheelhouse build \
	  $(foreach f,$(NODE),--node $(f)) --group $(GROUP) --python-version $(NODE_PYTHON) --out $(WHEELHOUSE_OUT) \
	  $(if $(MAX_MIB),--max-mib $(MAX_MIB),) --preset $(XZ_PRESET)


# The GPU node simulated (tests/test_node.py, marker slow): a fresh venv of only its packages, the archives of
# `make wheelhouse` for this Python, no network; every section of --cpu-smoke, then the light archive alone.
test-node: install
	WANDB_MODE=disabled $(PY) -m pytest -q -m slow tests/test_node.py

# One rehearsal row as a 2-node x 2-rank SLURM job on this machine (docs/paper-scale.md, "Several nodes, rehearsed").
NODES ?= 2
rehearse-nodes: install
	WANDB_MODE=$${WANDB_MODE:-offline} $(PY) -m lmk.run.cluster --nodes $(NODES) --tasks-per-node 2 -- $(PY) -m lmk.train \
	  experiment=table2-rehearsal launcher.nodes=$(NODES) pooling=cls ++row=cls overwrite=true \
	  hydra.run.dir=$(OUT)/rehearsal-nodes/cls

# A real two-node SLURM cluster with accounting on this machine (root, Debian; a development tool in
# tools/local_slurm/, not part of the library). Stdlib-only, so the system python runs it with tools/ on
# PYTHONPATH: no `make install` first.
LOCAL_SLURM := PYTHONPATH=$(CURDIR)/tools $(PYTHON) -m local_slurm
slurm-up:
	$(LOCAL_SLURM) up

slurm-down:
	$(LOCAL_SLURM) down

slurm-status:
	$(LOCAL_SLURM) status

clean:
	rm -rf $(OUT) multirun .pytest_cache
