"""GPU micro-benchmarks (run by bench/gpu_check.sh; needs CUDA, torch and cuda-python, no vLLM).

1. Page map latency of the CUDA backend: cold (cuMemCreate + cuMemMap) vs from the reserve.
1b. The shared zero page: the device memory a large, wholly unmapped virtual range holds (one
   granule, not the range), what a kernel reading all of it sees (zeros), and its read speed.
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


def zero_page(virtual: int = 16 << 30) -> dict[str, float]:
    """Every unmapped granule of the range is the one shared zero page: a 16 GiB range costs one
    granule of device memory, reads zeros everywhere, and a kernel over it does not fault."""
    torch.cuda.synchronize()
    free_before = torch.cuda.mem_get_info()[0]
    backend = CudaBackend(virtual, reserve_granules=0)
    torch.cuda.synchronize()
    held = free_before - torch.cuda.mem_get_info()[0]
    t = backend.as_tensor()
    total = int(t[: 1 << 30].view(torch.int64).sum())  # the first GiB through the zero page
    seconds = _timed(lambda: t[: 1 << 30].view(torch.int64).sum())
    backend.close()
    return {"virtual_gib": virtual / (1 << 30), "device_bytes_held": float(held),
            "granule_bytes": float(backend.granularity), "sum_of_unmapped_gib": float(total),
            "read_unmapped_gbps": (1 << 30) / seconds / 1e9}  # fmt: skip


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

    res: dict[str, float] = {}
    for direction, dst, src in (("d2h", host, dev), ("h2d", dev, host)):
        peak = total / _timed(lambda d=dst, s=src: d.copy_(s, non_blocking=True)) / 1e9
        w = total / _timed(lambda d=dst, s=src: whole(d, s)) / 1e9
        p = total / _timed(lambda d=dst, s=src: pieces(d, s)) / 1e9
        res |= {f"{direction}_peak_gbps": peak, f"{direction}_whole_block_gbps": w, f"{direction}_per_layer_gbps": p}
        res[f"{direction}_whole_over_peak"] = w / peak
        res[f"{direction}_whole_over_per_layer"] = w / p
    return res


def tier_copies() -> dict[str, float]:
    """The CPU tier's own copies (HostBlockStore pinned + copy_blocks), uniform vs per-layer,
    against the pinned-memory peak of one large copy (goal: whole blocks >= 80% of it)."""
    import tempfile
    from pathlib import Path

    from kvpool.offload import HostBlockStore, copy_blocks
    from kvpool.offload.store import chunk_layout

    n_blocks = 128
    dev = torch.empty(n_blocks * BLOCK, dtype=torch.uint8, device="cuda")
    blocks, chunks = list(range(n_blocks)), list(range(n_blocks))
    res: dict[str, float] = {}
    with tempfile.TemporaryDirectory(dir="/dev/shm") as d:
        for name, pieces in (("uniform", 1), ("per_layer", LAYERS)):
            regions, chunk_bytes = chunk_layout(list(dev.view(pieces, n_blocks, BLOCK // pieces)))
            store = HostBlockStore(Path(d) / name, n_blocks, chunk_bytes, pin=True)
            flat = store.tensor.view(-1)
            if name == "uniform":
                for direction, dst, src in (("d2h", flat, dev), ("h2d", dev, flat)):
                    res[f"tier_{direction}_peak_gbps"] = dst.numel() / _timed(
                        lambda d=dst, s=src: d.copy_(s, non_blocking=True)) / 1e9  # fmt: skip
            for direction, to_store in (("d2h", True), ("h2d", False)):
                t = _timed(lambda r=regions, s=store, ts=to_store: copy_blocks(
                    r, s.tensor, blocks, chunks, ts, non_blocking=True))  # fmt: skip
                res[f"tier_{direction}_{name}_gbps"] = n_blocks * BLOCK / t / 1e9
            store.close()
    for direction in ("d2h", "h2d"):
        res[f"tier_{direction}_uniform_over_peak"] = (
            res[f"tier_{direction}_uniform_gbps"] / res[f"tier_{direction}_peak_gbps"]
        )
        res[f"tier_{direction}_uniform_over_per_layer"] = (
            res[f"tier_{direction}_uniform_gbps"] / res[f"tier_{direction}_per_layer_gbps"]
        )
    return res


def main() -> None:
    sections = {"map": map_latency(), "zero_page": zero_page(), "copy": copies(), "tier": tier_copies()}
    for section, figures in sections.items():
        for k, v in figures.items():
            print(f"{section:>9} {k:>28}: {v:10.2f}")
    write_result("gpu", {"device": torch.cuda.get_device_name(), **sections})


if __name__ == "__main__":
    main()
