"""Host backend: memory really follows map/unmap (RSS), a remapped page reads zeros, and an
access to an unmapped page faults instead of reading garbage."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from kvpool import ConfigError
from kvpool.vmm.host import HostBackend
from tests.kvpool.factories import MiB, rss_bytes


def test_rss_rises_when_pages_are_mapped_and_falls_when_unmapped() -> None:
    backend = HostBackend(256 * MiB, prefault=True)
    try:
        before = rss_bytes()
        backend.map(0, 64 * MiB)
        mapped = rss_bytes()
        backend.unmap(0, 64 * MiB)
        after = rss_bytes()
    finally:
        backend.close()
    assert mapped - before >= 60 * MiB
    assert mapped - after >= 60 * MiB
    assert backend.mapped_bytes == 0


def test_reserving_a_huge_range_costs_no_resident_memory() -> None:
    before = rss_bytes()
    backend = HostBackend(64 << 30)  # 64 GiB of address space on a 24 GiB machine
    try:
        assert rss_bytes() - before < 4 * MiB
    finally:
        backend.close()


def test_a_remapped_page_reads_zeros_through_the_tensor() -> None:
    backend = HostBackend(4 * MiB)
    try:
        t = backend.as_tensor()
        backend.map(0, 2 * MiB)
        t[: 2 * MiB].fill_(7)
        backend.unmap(0, 2 * MiB)
        backend.map(0, 2 * MiB)
        assert int(t[: 2 * MiB].sum()) == 0
        del t
    finally:
        backend.close()


def test_touching_an_unmapped_page_is_a_segfault() -> None:
    script = textwrap.dedent(
        """
        from kvpool.vmm.host import HostBackend
        b = HostBackend(1 << 20)
        t = b.as_tensor()
        b.map(0, 4096)
        t[0] = 1          # mapped: fine
        print("mapped ok", flush=True)
        t[8192] = 1       # unmapped: must fault
        print("no fault")
        """
    )
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert proc.returncode == -11, (proc.returncode, proc.stdout, proc.stderr)
    assert proc.stdout == "mapped ok\n"


@pytest.mark.parametrize(
    ("offset", "length", "message"),
    [(100, 4096, "aligned"), (0, 0, "non-empty"), (0, 8 * MiB, "inside the reservation")],
)
def test_bad_ranges_are_refused_and_nothing_is_mapped(offset: int, length: int, message: str) -> None:
    backend = HostBackend(4 * MiB)
    try:
        with pytest.raises(ConfigError, match=message):
            backend.map(offset, length)
        assert backend.mapped_bytes == 0
    finally:
        backend.close()


def test_mapping_twice_or_unmapping_an_unmapped_range_is_refused() -> None:
    backend = HostBackend(4 * MiB)
    try:
        backend.map(0, 8192)
        with pytest.raises(ConfigError, match="already mapped"):
            backend.map(4096, 8192)
        with pytest.raises(ConfigError, match="not mapped"):
            backend.unmap(4096, 8192)
        assert backend.mapped_bytes == 8192
    finally:
        backend.close()


def test_map_all_maps_every_range_or_none() -> None:
    backend = HostBackend(4 * MiB)
    try:
        backend.map_all([(0, 4096), (8192, 4096)])
        assert backend.mapped_bytes == 8192
        with pytest.raises(ConfigError, match="already mapped"):
            backend.map_all([(16384, 4096), (8192, 4096)])  # the second is taken: roll back the first
        assert backend.mapped_bytes == 8192
        assert not backend.is_mapped(16384)
    finally:
        backend.close()
