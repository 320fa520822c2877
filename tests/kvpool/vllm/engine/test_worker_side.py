"""Worker half on the host backend: vLLM's one KV allocation lands in the reservation, commands
map and unmap every layer region of a page, repeats are harmless, failures are reported."""

from __future__ import annotations

import pytest
import torch

from kvpool import ConfigError, Geometry, KVLayout, ModelShape
from kvpool.vllm.engine.protocol import PageCommand, PageOp, PoolMetadata
from kvpool.vllm.engine.settings import ConnectorSettings
from kvpool.vllm.engine.worker_side import WorkerSide

pytestmark = pytest.mark.slow  # imports vLLM

SHAPE = ModelShape(num_layers=2, num_kv_heads=1, head_dim=64, dtype_bytes=2, block_size=32)  # 8 KiB layer pages
PAGE = 32 << 10


def make_worker() -> WorkerSide:
    geo = Geometry(SHAPE, KVLayout.PER_LAYER, num_blocks=64, page_bytes=PAGE)
    return WorkerSide(ConnectorSettings(limit_bytes=1 << 20, page_bytes=PAGE), geo)


def test_the_kv_allocation_is_served_from_the_reservation_once() -> None:
    worker = make_worker()
    size = worker.geometry.total_bytes
    with worker.allocation_context():
        buf = torch.zeros(size, dtype=torch.int8, device="cpu")
        other = torch.zeros(size, dtype=torch.int8)  # a second allocation is left alone
    assert buf.data_ptr() == worker.backend.address()
    assert other.data_ptr() != worker.backend.address()
    worker.check_views({"layer.0": buf[: 8 << 10]})
    with pytest.raises(ConfigError, match="not in kvpool's range"):
        worker.check_views({"layer.0": other})


def test_commands_map_the_page_in_every_layer_region_and_repeat_harmlessly() -> None:
    worker = make_worker()
    geo = worker.geometry
    assert worker.mapped_bytes == geo.page_physical_bytes  # page 0: the null block
    cmds = [PageCommand(1, 3, PageOp.MAP), PageCommand(2, 3, PageOp.MAP), PageCommand(3, 5, PageOp.MAP)]
    worker.apply(PoolMetadata(cmds))
    for r in geo.page_ranges(3):  # type: ignore[arg-type]
        assert worker.backend.is_mapped(r.offset)
    worker.apply(PoolMetadata([PageCommand(4, 5, PageOp.UNMAP), PageCommand(5, 5, PageOp.UNMAP)]))
    result = worker.take_results()
    assert result is not None
    assert (result.done, result.failed) == (frozenset({1, 2, 3, 4, 5}), {})
    assert worker.mapped_bytes == 2 * geo.page_physical_bytes
    assert worker.take_results() is None


def test_a_failing_command_is_reported_not_raised() -> None:
    worker = make_worker()
    worker.apply(PoolMetadata([PageCommand(9, 10_000, PageOp.MAP)]))  # no such page
    result = worker.take_results()
    assert result is not None
    assert result.done == frozenset()
    assert "outside" in result.failed[9]


def test_pools_sharing_a_ledger_never_map_beyond_its_budget(tmp_path) -> None:  # type: ignore[no-untyped-def]
    geo = Geometry(SHAPE, KVLayout.PER_LAYER, num_blocks=64, page_bytes=PAGE)
    budget = 3 * geo.page_physical_bytes
    settings = {"limit_bytes": 1 << 20, "page_bytes": PAGE, "ledger_bytes": budget, "ledger_path": str(tmp_path / "l")}
    a = WorkerSide(ConnectorSettings(**settings, model="a"), geo)  # type: ignore[arg-type]
    b = WorkerSide(ConnectorSettings(**settings, model="b"), geo)  # type: ignore[arg-type]
    a.apply(PoolMetadata([PageCommand(1, 1, PageOp.MAP)]))  # null pages + this one: the budget is spent
    b.apply(PoolMetadata([PageCommand(2, 1, PageOp.MAP)]))
    refused = b.take_results()
    assert refused is not None
    assert "overdraw the budget" in refused.failed[2]
    assert b.mapped_bytes == geo.page_physical_bytes  # the refused map left nothing behind
    a.apply(PoolMetadata([PageCommand(3, 1, PageOp.UNMAP)]))
    b.apply(PoolMetadata([PageCommand(4, 1, PageOp.MAP)]))  # a's unmap credited the ledger
    granted = b.take_results()
    assert granted is not None
    assert granted.done == frozenset({4})
    a.close()
    b.close()
