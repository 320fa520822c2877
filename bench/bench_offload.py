"""The CPU tier: whole-block transfer throughput by layout, and what a tier hit saves in TTFT.

1. Transfers through the real tier code (``HostBlockStore`` + ``copy_blocks``, the copies the
   engine's TierWorker makes), Llama-3.1-8B geometry (bf16, 16-token blocks = 2 MiB per block):
   the uniform layout moves a block as one 2 MiB copy; vLLM 0.32's per-layer layout as 32 pieces
   of 64 KiB; split-K/V layouts as 64 of 32 KiB. Pool -> tier (store) and tier -> pool (load).
2. TTFT of a long prompt on a real engine (tiny model, CPU) with the tier on, same run:
   recompute (first sight) vs pool prefix hit (asked again) vs tier hit (asked again after the
   pool dropped it: ``trim`` demotes its blocks).
"""

from __future__ import annotations

import argparse
import random
import statistics
import tempfile
from pathlib import Path
from typing import Any

import torch

from bench.common import best_of, write_result
from kvpool.offload import HostBlockStore, copy_blocks
from kvpool.offload.store import chunk_layout

MiB = 1 << 20
BLOCK = 2 * MiB
NUM_BLOCKS = 128


def transfers(tmp: Path) -> dict[str, dict[str, float]]:
    torch.set_num_threads(1)  # one copy engine, as a DMA would be
    pool = torch.randint(0, 255, (NUM_BLOCKS * BLOCK,), dtype=torch.uint8)
    blocks = list(range(0, NUM_BLOCKS, 2))  # every other block: no accidental single big copy
    chunks = list(range(len(blocks)))
    out: dict[str, dict[str, float]] = {}
    for name, pieces in (("uniform_1x2MiB", 1), ("per_layer_32x64KiB", 32), ("split_kv_64x32KiB", 64)):
        # the pool as the tier sees it: `pieces` regions of (num_blocks, BLOCK / pieces) bytes
        regions, chunk_bytes = chunk_layout(list(pool.view(pieces, NUM_BLOCKS, BLOCK // pieces)))
        store = HostBlockStore(tmp / f"bench-{name}", len(chunks), chunk_bytes)
        store.tensor.fill_(1)  # commit the store's memory before timing
        moved = len(blocks) * BLOCK

        def run(to_store: bool, regions: Any = regions, store: HostBlockStore = store) -> None:
            copy_blocks(regions, store.tensor, blocks, chunks, to_store)

        out[name] = {
            "store_gbps": moved / best_of(lambda: run(True), 5) / 1e9,
            "load_gbps": moved / best_of(lambda: run(False), 5) / 1e9,
        }
        store.close()
    return out


def ttft(tmp: Path, prompts: int, tokens: int) -> dict[str, float]:
    from vllm import SamplingParams

    from kvpool.vllm.launch.args import PoolEngineConfig
    from kvpool.vllm.launch.runner import EngineRunner
    from kvpool.vllm.launch.tiny_model import build_tiny_model

    model = str(build_tiny_model(Path(tempfile.gettempdir()) / "kvpool-bench-tiny"))
    cfg = PoolEngineConfig(model=model, limit_bytes=64 * MiB, virtual_bytes=512 * MiB,
                           offload_bytes=128 * MiB, offload_dir=str(tmp))  # fmt: skip
    runner = EngineRunner(model, cfg, max_model_len=tokens + 64)
    params = SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True)
    rng = random.Random(0)
    times: dict[str, list[float]] = {"recompute": [], "pool_hit": [], "tier_hit": []}
    try:
        runner.generate([[rng.randrange(10, 2000) for _ in range(tokens)]], params)  # warm-up
        for _ in range(prompts):
            p = [rng.randrange(10, 2000) for _ in range(tokens)]
            times["recompute"].append(runner.generate([p], params)[0].ttft_s)
            times["pool_hit"].append(runner.generate([p], params)[0].ttft_s)
            runner.trim()
            times["tier_hit"].append(runner.generate([p], params)[0].ttft_s)
        stats = runner.snapshot().offload
        assert stats is not None, "the tier is off"
    finally:
        runner.close()
    med = {f"{k}_ttft_ms": statistics.median(v) * 1e3 for k, v in times.items()}
    med["tier_hits"] = stats.hits
    return med


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=1984, help="prompt length (whole 32-token blocks)")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(dir="/dev/shm") as d:
        gbps = transfers(Path(d))
        for name, v in gbps.items():
            print(f"{name:>20}: store {v['store_gbps']:6.2f} GB/s   load {v['load_gbps']:6.2f} GB/s")
        uni = gbps["uniform_1x2MiB"]
        ratios = {
            f"uniform_over_{k}_{d}": uni[f"{d}_gbps"] / v[f"{d}_gbps"]
            for k, v in gbps.items() if k != "uniform_1x2MiB" for d in ("store", "load")
        }  # fmt: skip
        for k, r in ratios.items():
            print(f"{k}: {r:.2f}x")
        t = ttft(Path(d), args.prompts, args.tokens)
    print("TTFT ms (median): " + "  ".join(f"{k} {v:.1f}" for k, v in t.items()))
    speedup = {"recompute_over_tier_hit": t["recompute_ttft_ms"] / t["tier_hit_ttft_ms"],
               "tier_hit_over_pool_hit": t["tier_hit_ttft_ms"] / t["pool_hit_ttft_ms"]}  # fmt: skip
    print("  ".join(f"{k} {v:.2f}x" for k, v in speedup.items()))
    write_result("bench_offload", {"args": vars(args), "transfer_gbps": gbps, "ratios": ratios, "ttft": t, **speedup})


if __name__ == "__main__":
    main()
