"""GPU micro-benchmarks (run by bench/gpu_check.sh; needs CUDA, torch and cuda-python, no vLLM).

1. Page map latency of the CUDA backend: cold (cuMemCreate + cuMemMap) vs from the reserve.
2. Pinned host <-> device block copies: one 2 MiB copy per block (uniform cross-layer) vs the
   same block as 32 x 64 KiB per-layer pieces, against the pinned-memory peak (one 256 MiB copy).
Writes results/gpu.json and prints ratios.
"""

from __future__ import annotations

import statistics
import time
from typing import Any

import torch

from bench.common import write_result
from kvpool.vmm.cuda import CudaBackend

MiB = 1 << 20
BLOCK = 2 * MiB
LAYERS = 32


def map_latency() -> dict[str, float]:
    out: dict[str, float] = {}
    for label, reserve in (("cold", 0), ("reserve", 64)):
        backend = CudaBackend(256 * MiB, reserve_granules=reserve)
        g = backend.granularity
        time.sleep(0.5)  # let the filler thread create the reserve
        lat = []
        for i in range(backend.size // g):
            t0 = time.perf_counter()
            backend.map(i * g, g)
            lat.append(time.perf_counter() - t0)
        unmap = []
        for i in range(backend.size // g):
            t0 = time.perf_counter()
            backend.unmap(i * g, g)
            unmap.append(time.perf_counter() - t0)
        backend.close()
        out[f"map_{label}_us_p50"] = statistics.median(lat[: reserve or None]) * 1e6
        out[f"unmap_{label}_us_p50"] = statistics.median(unmap) * 1e6
    out["cold_over_reserve"] = out["map_cold_us_p50"] / out["map_reserve_us_p50"]
    return out


def _timed(fn: Any, repeat: int = 10) -> float:
    stream = torch.cuda.current_stream()
    fn()
    stream.synchronize()
    best = float("inf")
    for _ in range(repeat):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        best = min(best, start.elapsed_time(end) / 1e3)
    return best


def copies() -> dict[str, float]:
    n_blocks = 128
    dev = torch.empty(n_blocks * BLOCK, dtype=torch.uint8, device="cuda")
    host = torch.empty(n_blocks * BLOCK, dtype=torch.uint8, pin_memory=True)
    piece = BLOCK // LAYERS
    total = n_blocks * BLOCK

    def whole(dst: torch.Tensor, src: torch.Tensor) -> None:
        for b in range(n_blocks):
            dst[b * BLOCK : (b + 1) * BLOCK].copy_(src[b * BLOCK : (b + 1) * BLOCK], non_blocking=True)

    def pieces(dst: torch.Tensor, src: torch.Tensor) -> None:
        for b in range(n_blocks):
            for lay in range(LAYERS):
                o = b * BLOCK + lay * piece
                dst[o : o + piece].copy_(src[o : o + piece], non_blocking=True)

    res = {}
    for direction, dst, src in (("d2h", host, dev), ("h2d", dev, host)):
        peak = total / _timed(lambda d=dst, s=src: d.copy_(s, non_blocking=True)) / 1e9
        w = total / _timed(lambda d=dst, s=src: whole(d, s)) / 1e9
        p = total / _timed(lambda d=dst, s=src: pieces(d, s)) / 1e9
        res |= {f"{direction}_peak_gbps": peak, f"{direction}_whole_block_gbps": w, f"{direction}_per_layer_gbps": p}
        res[f"{direction}_whole_over_peak"] = w / peak
        res[f"{direction}_whole_over_per_layer"] = w / p
    return res


def main() -> None:
    results = {"device": torch.cuda.get_device_name(), "map": map_latency(), "copy": copies()}
    for section in ("map", "copy"):
        for k, v in results[section].items():  # type: ignore[union-attr]
            print(f"{section:>5} {k:>28}: {v:10.2f}")
    write_result("gpu", results)


if __name__ == "__main__":
    main()
