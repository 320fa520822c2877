"""A short, real demonstration of the elastic pool on this machine (``python -m kvpool.demo``).

It reserves a large virtual KV cache, lets "requests" allocate blocks (pages are mapped on
demand, RSS follows), shrinks the limit while blocks are in use (deferred, then applied as they
free) and trims -- printing the snapshot and the process RSS at each step.
"""

from __future__ import annotations

import argparse

from kvpool import KVLayout, KVPool, ModelShape, PoolConfig

MiB = 1 << 20


def _rss() -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmRSS:"))


def _show(step: str, pool: KVPool) -> None:
    s = pool.snapshot()
    print(
        f"{step:<34} limit {s.limit_bytes / MiB:7.1f} MiB  mapped {s.mapped_bytes / MiB:7.1f} MiB  "
        f"used/cached/free {s.used_blocks}/{s.cached_blocks}/{s.free_blocks}  "
        f"resize {s.pending.status.value:<8}  RSS {_rss() / MiB:7.1f} MiB"
    )
    pool.check_integrity()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--virtual-gib", type=int, default=16, help="virtual KV capacity to reserve (GiB)")
    parser.add_argument("--limit-mib", type=int, default=512, help="initial physical limit (MiB)")
    args = parser.parse_args(argv)
    shape = ModelShape(num_layers=32, num_kv_heads=8, head_dim=128, dtype_bytes=2, block_size=16)  # Llama-3.1-8B
    pool = KVPool(
        PoolConfig(
            shape=shape,
            virtual_bytes=args.virtual_gib << 30,
            limit_bytes=args.limit_mib * MiB,
            layout=KVLayout.UNIFORM,
            model="llama-3.1-8b-shape",
        )
    )
    print(f"reserved {pool.geometry.total_bytes >> 30} GiB virtual, {pool.geometry.num_blocks} blocks of 2 MiB")
    _show("start", pool)
    requests = [pool.allocate(32).blocks for _ in range(6)]
    _show("6 requests x 32 blocks", pool)
    result = pool.resize(128 * MiB, revision=1)
    _show(f"shrink to 128 MiB -> {result.status.value}", pool)
    for blocks in requests[:4]:
        pool.free(blocks, cache=True)
    _show("4 requests finish (cached)", pool)
    for blocks in requests[4:]:
        pool.free(blocks)
    _show("all requests finish", pool)
    trimmed = pool.trim()
    _show(f"trim: {trimmed.released_pages} pages released", pool)
    pool.close()


if __name__ == "__main__":
    main()
