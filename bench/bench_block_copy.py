"""Copying one KV block: one contiguous range (uniform cross-layer) vs its per-layer pieces.

Realistic geometry: Llama-3.1-8B, bf16, 16-token blocks -> 2 MiB per block. In vLLM 0.32's
LBHNC layout a block is 32 pieces of 64 KiB (K and V share a cell); older split-K/V layouts
make it 64 pieces of 32 KiB. Both are measured against the single 2 MiB copy, host memcpy
(torch ``copy_``) into a pool-sized destination, the same blocks in each case.
"""

from __future__ import annotations

import torch

from bench.common import best_of, write_result
from kvpool import Geometry, KVLayout, ModelShape

LLAMA8B = ModelShape(num_layers=32, num_kv_heads=8, head_dim=128, dtype_bytes=2, block_size=16)
BLOCKS = 64  # blocks moved per measurement (128 MiB)


def copy_uniform(src: torch.Tensor, dst: torch.Tensor, geo: Geometry, blocks: list[int]) -> None:
    for b in blocks:
        (r,) = geo.block_ranges(b)  # type: ignore[arg-type]
        dst[r.offset : r.offset + r.length].copy_(src[r.offset : r.offset + r.length])


def copy_pieces(src: torch.Tensor, dst: torch.Tensor, geo: Geometry, blocks: list[int], split: int) -> None:
    for b in blocks:
        for r in geo.block_ranges(b):  # type: ignore[arg-type]
            step = r.length // split
            for k in range(split):
                o = r.offset + k * step
                dst[o : o + step].copy_(src[o : o + step])


def main() -> None:
    torch.set_num_threads(1)  # one copy engine, as a DMA would be; avoids thread-pool noise
    uni = Geometry(LLAMA8B, KVLayout.UNIFORM, num_blocks=320, page_bytes=2 << 20)
    per = Geometry(LLAMA8B, KVLayout.PER_LAYER, num_blocks=320, page_bytes=2 << 20)
    src = torch.randint(0, 255, (uni.total_bytes,), dtype=torch.uint8)
    dst = torch.zeros_like(src)
    blocks = list(range(7, 7 + 4 * BLOCKS, 4))
    moved = BLOCKS * LLAMA8B.block_bytes
    cases = {
        "uniform_1x2MiB": lambda: copy_uniform(src, dst, uni, blocks),
        "per_layer_32x64KiB": lambda: copy_pieces(src, dst, per, blocks, 1),
        "split_kv_64x32KiB": lambda: copy_pieces(src, dst, per, blocks, 2),
    }
    gbps = {name: moved / best_of(fn, 7) / 1e9 for name, fn in cases.items()}
    for name, v in gbps.items():
        print(f"{name:>20}: {v:6.2f} GB/s")
    ratios = {k: gbps["uniform_1x2MiB"] / v for k, v in gbps.items() if k != "uniform_1x2MiB"}
    for k, v in ratios.items():
        print(f"uniform / {k}: {v:.2f}x")
    write_result("bench_block_copy", {"block_bytes": LLAMA8B.block_bytes, "gbps": gbps, "uniform_over": ratios})


if __name__ == "__main__":
    main()
