"""Factories for pools on the real host backend (real mmap, real RSS)."""

from __future__ import annotations

from typing import Any

from kvpool import KVLayout, ModelShape, PoolConfig

KiB = 1 << 10
MiB = 1 << 20

#: the tiny test model: 4 layers, 2 KV heads, head_dim 64, bf16, 16-token blocks
#: (8 KiB per layer page, 32 KiB per block)
TINY = ModelShape(num_layers=4, num_kv_heads=2, head_dim=64, dtype_bytes=2, block_size=16)


def make_config(**overrides: Any) -> PoolConfig:
    fields: dict[str, Any] = {
        "shape": TINY,
        "virtual_bytes": 64 * MiB,
        "limit_bytes": 16 * MiB,
        "page_bytes": 64 * KiB,
        "layout": KVLayout.UNIFORM,
        "reserve_pages": 0,
    }
    fields.update(overrides)
    return PoolConfig(**fields)


def rss_bytes() -> int:
    """Resident set size of this process, from /proc (what the kernel really backs)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * KiB
    raise RuntimeError("VmRSS not found in /proc/self/status")
