"""The host block store: a bounded shared-memory file, whole-block copies in both layouts."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
import torch

from kvpool import ConfigError
from kvpool.offload import HostBlockStore, StoreDamaged, copy_blocks, reap_stale
from kvpool.offload.store import chunk_layout


def pool_regions(num_blocks: int, pieces: int, piece_bytes: int) -> list[torch.Tensor]:
    """``pieces`` regions of ``num_blocks`` blocks, filled with distinct bytes."""
    base = torch.arange(num_blocks * pieces * piece_bytes, dtype=torch.int64) % 251
    return [t.to(torch.uint8).view(num_blocks, piece_bytes) for t in base.chunk(pieces)]


@pytest.mark.parametrize("pieces", [1, 4], ids=["uniform", "per-layer"])
def test_blocks_round_trip_through_the_store(tmp_path: Path, pieces: int) -> None:
    src = pool_regions(8, pieces, 512)
    regions, chunk_bytes = chunk_layout(src)
    assert chunk_bytes == pieces * 512
    store = HostBlockStore(tmp_path / "tier", num_chunks=4, chunk_bytes=chunk_bytes)
    moved = copy_blocks(regions, store.tensor, blocks=[5, 2], chunks=[3, 0], to_store=True)
    assert moved == 2 * chunk_bytes
    # chunk 3 holds block 5's pieces one after another
    assert torch.equal(store.tensor[3], torch.cat([r[5] for r in src]))
    dst = [torch.zeros_like(r) for r in src]
    dst_regions, _ = chunk_layout(dst)
    copy_blocks(dst_regions, store.tensor, blocks=[1, 7], chunks=[3, 0], to_store=False)
    for s, d in zip(src, dst, strict=True):
        assert torch.equal(d[1], s[5])
        assert torch.equal(d[7], s[2])
        assert not d[0].any()  # nothing else was written
    store.close()


def test_the_store_is_a_fixed_size_file_reserved_at_start_that_leaves_with_it(tmp_path: Path) -> None:
    store = HostBlockStore(tmp_path / "tier", num_chunks=16, chunk_bytes=4096)
    assert os.stat(store.path).st_size == store.capacity_bytes == 16 * 4096
    assert os.stat(store.path).st_blocks * 512 >= store.capacity_bytes  # reserved: no write can find it full
    store.tensor[3].fill_(7)
    assert (tmp_path / "tier").read_bytes()[3 * 4096] == 7  # visible from outside the process
    with pytest.raises(IndexError):
        store.tensor[16]
    store.close()
    assert not store.path.exists()


def test_bad_sizes_and_an_existing_file_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="at least one chunk"):
        HostBlockStore(tmp_path / "a", num_chunks=0, chunk_bytes=4096)
    (tmp_path / "b").write_bytes(b"someone else's")
    with pytest.raises(FileExistsError):
        HostBlockStore(tmp_path / "b", num_chunks=1, chunk_bytes=4096)
    assert (tmp_path / "b").read_bytes() == b"someone else's"
    with pytest.raises(ConfigError, match="2-D byte tensor"):
        chunk_layout([torch.zeros(4, 4, dtype=torch.float16)])


def test_mismatched_block_and_chunk_lists_are_refused(tmp_path: Path) -> None:
    regions, chunk_bytes = chunk_layout(pool_regions(4, 1, 64))
    store = HostBlockStore(tmp_path / "tier", num_chunks=2, chunk_bytes=chunk_bytes)
    with pytest.raises(ValueError, match="2 blocks but 1 chunks"):
        copy_blocks(regions, store.tensor, [0, 1], [0], to_store=True)
    store.close()


@pytest.mark.skipif(os.geteuid() != 0, reason="mounts a small tmpfs (root)")
def test_a_directory_too_small_for_the_tier_is_a_clear_error_at_start(tmp_path: Path) -> None:
    """As a pod's /dev/shm sized below its tier: refused at start, naming the flags, no file left
    (a sparse file would have died of SIGBUS on the first write past the room)."""
    small = tmp_path / "shm"
    small.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(small)], check=True)
    try:
        with pytest.raises(ConfigError, match=r"needs 4194304 bytes in .* --offload-bytes .* --offload-dir"):
            HostBlockStore(small / "tier", num_chunks=64, chunk_bytes=64 << 10)
        assert list(small.iterdir()) == []
    finally:
        subprocess.run(["umount", str(small)], check=True)


def test_a_file_cut_under_the_store_is_given_its_size_back_and_reported_once(tmp_path: Path) -> None:
    """A root shell truncates the file: the next check restores its size and memory (a copy into
    the cut part would have faulted), says the contents are gone (zeros now), and copies work again."""
    regions, chunk_bytes = chunk_layout(pool_regions(4, 1, 4096))
    store = HostBlockStore(tmp_path / "tier", num_chunks=4, chunk_bytes=chunk_bytes)
    copy_blocks(regions, store.tensor, [1], [2], to_store=True)
    assert store.restore_if_cut() is False
    os.truncate(store.path, 4096)
    assert store.restore_if_cut() is True
    assert os.stat(store.path).st_size == store.capacity_bytes
    assert os.stat(store.path).st_blocks * 512 >= store.capacity_bytes
    assert int(store.tensor[2].count_nonzero()) == 0  # what was stored is gone: the caller must not load it
    copy_blocks(regions, store.tensor, [1], [2], to_store=True)  # no fault
    assert torch.equal(store.tensor[2], regions[0].tensor[1])
    assert store.restore_if_cut() is False
    store.path.unlink()  # a deleted name changes nothing: the fd and the mapping keep the memory
    assert store.restore_if_cut() is False
    store.close()


@pytest.mark.skipif(os.geteuid() != 0, reason="mounts a small tmpfs (root)")
def test_a_cut_file_whose_room_is_gone_is_refused_for_good(tmp_path: Path) -> None:
    small = tmp_path / "shm"
    small.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(small)], check=True)
    try:
        store = HostBlockStore(small / "tier", num_chunks=8, chunk_bytes=64 << 10)  # 512 KiB of 1 MiB
        os.truncate(store.path, 0)
        (small / "squatter").write_bytes(bytes(900 << 10))  # the room is taken meanwhile
        for _ in range(2):
            with pytest.raises(StoreDamaged, match="cut and could not be restored"):
                store.restore_if_cut()
        store.close()
    finally:
        subprocess.run(["umount", str(small)], check=True)


def test_files_nobody_holds_are_reaped_and_a_live_stores_is_kept(tmp_path: Path) -> None:
    """A killed worker cannot remove its file. Whether its owner lives is told by the lock the
    store holds, not by the pid in the name: a restarted container reuses pids, even the new
    worker's own."""
    import sys

    live = HostBlockStore(tmp_path / "kvpool-tier-m-1-r0", num_chunks=2, chunk_bytes=4096)
    reused = tmp_path / f"kvpool-tier-m-{os.getpid()}-r1"  # a dead owner's pid, alive again
    reused.write_bytes(b"x")
    killed = tmp_path / "kvpool-tier-m-2-r0"
    holder = subprocess.Popen([sys.executable, "-c", f"""
import sys, time
from pathlib import Path
from kvpool.offload import HostBlockStore
s = HostBlockStore(Path({str(killed)!r}), 2, 4096)
print("held", flush=True)
time.sleep(600)
"""], stdout=subprocess.PIPE, text=True)  # fmt: skip
    assert holder.stdout is not None
    assert holder.stdout.readline() == "held\n"
    assert reap_stale(tmp_path) == [reused]  # the other process's store is alive: kept
    holder.kill()
    holder.wait()
    assert reap_stale(tmp_path) == [killed]
    assert [p.name for p in tmp_path.iterdir()] == [live.path.name]
    live.close()
    assert list(tmp_path.iterdir()) == []
