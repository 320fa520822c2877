"""Per-page map and unmap latency of the host backend (2 MiB and 64 KiB pages).

Run: ``python -m bench.bench_pages``. The CUDA numbers (cold cuMemCreate+map vs from the
reserve) come from ``bench/gpu_bench.py`` in the GPU script.
"""

from __future__ import annotations

import statistics
import time

from bench.common import write_result
from kvpool.vmm.host import HostBackend

MiB = 1 << 20


def measure(page: int, pages: int, prefault: bool) -> dict[str, float]:
    backend = HostBackend(page * pages, prefault=prefault)
    maps, unmaps = [], []
    try:
        for rnd in range(3):
            for i in range(pages):
                t0 = time.perf_counter()
                backend.map(i * page, page)
                maps.append(time.perf_counter() - t0)
            if not prefault and rnd == 0:
                backend.as_tensor().fill_(1)  # pay the faults so unmap frees real pages
            for i in range(pages):
                t0 = time.perf_counter()
                backend.unmap(i * page, page)
                unmaps.append(time.perf_counter() - t0)
    finally:
        backend.close()
    return {"map_us_p50": statistics.median(maps) * 1e6, "unmap_us_p50": statistics.median(unmaps) * 1e6}


def main() -> None:
    rows = {}
    for page, pages in ((2 * MiB, 64), (64 << 10, 512)):
        for prefault in (True, False):
            key = f"{page // 1024}KiB_{'prefault' if prefault else 'lazy'}"
            rows[key] = measure(page, pages, prefault)
            r = rows[key]
            print(f"{key:>20}: map {r['map_us_p50']:8.1f} us   unmap {r['unmap_us_p50']:8.1f} us")
    ratio = rows["2048KiB_prefault"]["map_us_p50"] / rows["2048KiB_prefault"]["unmap_us_p50"]
    print(f"2 MiB prefaulted map / unmap latency ratio: {ratio:.1f}x")
    write_result("bench_pages", {"rows": rows, "map_over_unmap_2MiB": ratio})


if __name__ == "__main__":
    main()
