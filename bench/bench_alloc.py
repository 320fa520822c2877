"""Block alloc + free throughput: KVPool against vLLM's own ``BlockPool``, same ops, same run.

A seeded trace of 64 concurrent "requests": prefills take 16 blocks, decodes take 1, finished
requests free everything. Both allocators start warm (every page of ours mapped), so this
measures bookkeeping only. Goal from the issue: the pool costs at most 1.1x vLLM's allocator.
"""

from __future__ import annotations

import random
from typing import Any

from bench.common import best_of, write_result
from kvpool import KVLayout, KVPool, ModelShape, PoolConfig

SHAPE = ModelShape(num_layers=4, num_kv_heads=2, head_dim=64, dtype_bytes=2, block_size=16)
NUM_BLOCKS = 4096
OPS = 20_000


def make_trace(seed: int = 0) -> list[tuple[str, int, int]]:
    """(op, request, n) with op in alloc/free; never holds more than NUM_BLOCKS // 2 blocks."""
    rng = random.Random(seed)
    held = [0] * 64
    trace = []
    for _ in range(OPS):
        r = rng.randrange(64)
        if held[r] and (rng.random() < 0.05 or sum(held) > NUM_BLOCKS // 2):
            trace.append(("free", r, held[r]))
            held[r] = 0
        else:
            n = 16 if not held[r] else 1
            trace.append(("alloc", r, n))
            held[r] += n
    return trace


def run_kvpool(pool: KVPool, trace: list[tuple[str, int, int]]) -> None:
    held: list[list[Any]] = [[] for _ in range(64)]
    for op, r, n in trace:
        if op == "alloc":
            held[r] += pool.allocate(n).blocks
        else:
            pool.free(held[r])
            held[r] = []
    for blocks in held:
        pool.free(blocks)


def run_vllm(block_pool: Any, trace: list[tuple[str, int, int]]) -> None:
    held: list[list[Any]] = [[] for _ in range(64)]
    for op, r, n in trace:
        if op == "alloc":
            held[r] += block_pool.get_new_blocks(n)
        else:
            block_pool.free_blocks(held[r])
            held[r] = []
    for blocks in held:
        block_pool.free_blocks(blocks)


def main() -> None:
    from vllm.v1.core.block_pool import BlockPool

    trace = make_trace()
    geo_bytes = NUM_BLOCKS * SHAPE.block_bytes
    pool = KVPool(PoolConfig(shape=SHAPE, virtual_bytes=geo_bytes, limit_bytes=geo_bytes, layout=KVLayout.UNIFORM))
    pool.free(pool.allocate(NUM_BLOCKS - 1).blocks)  # warm: every page mapped
    block_pool = BlockPool(num_gpu_blocks=NUM_BLOCKS, enable_caching=True, hash_block_size=16)
    t_ours = best_of(lambda: run_kvpool(pool, trace), 5)
    t_vllm = best_of(lambda: run_vllm(block_pool, trace), 5)
    pool.check_integrity()
    pool.close()
    blocks_moved = sum(n for op, _, n in trace if op == "alloc")
    print(f"kvpool : {blocks_moved / t_ours / 1e6:6.2f} M blocks/s ({t_ours * 1e3:.1f} ms)")
    print(f"vLLM   : {blocks_moved / t_vllm / 1e6:6.2f} M blocks/s ({t_vllm * 1e3:.1f} ms)")
    print(f"kvpool time / vLLM BlockPool time: {t_ours / t_vllm:.2f}x (goal <= 1.10x)")
    write_result(
        "bench_alloc",
        {"ops": len(trace), "blocks": blocks_moved, "kvpool_s": t_ours, "vllm_s": t_vllm, "ratio": t_ours / t_vllm},
    )


if __name__ == "__main__":
    main()
