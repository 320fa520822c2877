"""A vLLM general plugin (entry point ``vllm.general_plugins``): on CPUs with AMX, keep vLLM 0.32's
CPU attention on its AVX-512 kernels.

Why: vLLM's AMX attention kernel (``cpu_attention::TileGemm122``, used for short query tiles)
runs ``tilezero`` on an OpenMP thread that has never loaded a tile configuration when the engine's
first request is short (a few prompt tokens): the worker dies of SIGILL and the engine with it.
Seen here on a 2-core AMX VM, stock vLLM and ours alike (gdb on the core: ``tilezero %tmm6`` in
``TileGemm122::gemm``, ``cpu_attn_amx.hpp:283``); a long first prefill configures the tiles and
hides it. vLLM picks its attention ISA from ``torch.cpu._is_amx_tile_supported()`` in each worker,
so the plugin -- loaded by vLLM in every engine process, stock or ours, so benchmarks compare like
with like -- answers False there. Nothing else changes: the KV layout is per process, and the CPU
tier copies whole blocks as bytes. ``KVPOOL_CPU_AMX_ATTENTION=1`` keeps vLLM's choice.
"""

from __future__ import annotations

import logging
import os

log = logging.getLogger(__name__)

ENV = "KVPOOL_CPU_AMX_ATTENTION"


def register() -> None:
    """Called by vLLM in each of its processes (more than once is harmless)."""
    if os.environ.get(ENV) == "1":
        return
    import torch

    if not torch.cpu._is_amx_tile_supported():  # a CPUID read: touches no device
        return
    from vllm.platforms import current_platform

    # not torch.cuda.is_available(): it initializes CUDA, which vLLM's parent must not before forking
    if not current_platform.is_cpu():
        return
    torch.cpu._is_amx_tile_supported = _no_amx
    log.info("kvpool: vLLM's CPU attention uses its AVX-512 kernels (its AMX ones crash on short "
             "first requests); %s=1 keeps AMX", ENV)  # fmt: skip


def _no_amx() -> bool:
    return False
