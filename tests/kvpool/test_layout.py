"""Layout geometry: every byte written through vLLM-style views lands where an independent
reference formula says, for both layouts; uniform blocks are one contiguous range; settings that
cannot tile pages are rejected with the setting to change."""

from __future__ import annotations

import pytest
import torch

from kvpool import ConfigError, Geometry, KVLayout, ModelShape
from kvpool.layout import fitting_page_bytes
from kvpool.views import layer_views
from tests.kvpool.factories import TINY, KiB


def reference_offset(layout: KVLayout, shape: ModelShape, nb: int, layer: int, block: int, head: int, tok: int) -> int:
    """Byte offset of a K/V cell, written out from the layout names rather than the module."""
    L, H, N, C = shape.num_layers, shape.num_kv_heads, shape.block_size, shape.cell_bytes
    if layout is KVLayout.UNIFORM:  # B, L, N, H, C
        return (((block * L + layer) * N + tok) * H + head) * C
    return (((layer * nb + block) * H + head) * N + tok) * C  # L, B, H, N, C


@pytest.mark.parametrize("layout", list(KVLayout))
def test_every_cell_written_through_views_lands_at_the_reference_offset(layout: KVLayout) -> None:
    shape = ModelShape(num_layers=3, num_kv_heads=2, head_dim=32, dtype_bytes=2, block_size=4)
    geo = Geometry(shape, layout, num_blocks=4, page_bytes=shape.layer_page_bytes)
    buf = torch.zeros(geo.total_bytes, dtype=torch.uint8)
    views = layer_views(buf, geo, torch.float16)
    expected = torch.zeros_like(buf)
    stamp = 0
    for layer, view in enumerate(views):
        for block in range(4):
            for head in range(2):
                for tok in range(4):
                    stamp += 1
                    view[block, head, tok].fill_(float(stamp))
                    cell = torch.full((shape.head_dim * 2,), float(stamp), dtype=torch.float16).view(torch.uint8)
                    off = reference_offset(layout, shape, 4, layer, block, head, tok)
                    expected[off : off + shape.cell_bytes] = cell
                    assert geo.cell_offset(layer, block, head, tok) == off
    assert torch.equal(buf, expected)


def test_a_uniform_block_is_one_contiguous_range_holding_all_its_layers() -> None:
    geo = Geometry(TINY, KVLayout.UNIFORM, num_blocks=32, page_bytes=64 * KiB)
    buf = torch.zeros(geo.total_bytes, dtype=torch.uint8)
    for view in layer_views(buf, geo, torch.bfloat16):
        view[5].fill_(1.0)
    touched = buf.nonzero().flatten()
    assert geo.block_ranges(5) == [(5 * TINY.block_bytes, TINY.block_bytes)]
    assert (int(touched.min()), int(touched.max()) + 1) == (5 * TINY.block_bytes, 6 * TINY.block_bytes)


def test_a_per_layer_block_is_one_range_per_layer_region() -> None:
    geo = Geometry(TINY, KVLayout.PER_LAYER, num_blocks=32, page_bytes=64 * KiB)
    lp = TINY.layer_page_bytes
    assert geo.block_ranges(5) == [(layer * 32 * lp + 5 * lp, lp) for layer in range(4)]


@pytest.mark.parametrize(
    ("layout", "page", "per_page", "segment", "physical"),
    [
        (KVLayout.UNIFORM, 64 * KiB, 2, 64 * KiB, 64 * KiB),  # 32 KiB blocks, 2 per page
        (KVLayout.UNIFORM, 4 * KiB, 1, 32 * KiB, 32 * KiB),  # a block spans 8 pages
        (KVLayout.PER_LAYER, 64 * KiB, 8, 64 * KiB, 256 * KiB),  # 8 KiB layer pages, 4 regions
    ],
)
def test_page_arithmetic_for_both_tilings(
    layout: KVLayout, page: int, per_page: int, segment: int, physical: int
) -> None:
    geo = Geometry(TINY, layout, num_blocks=per_page * 8, page_bytes=page)
    assert (geo.blocks_per_page, geo.segment_bytes, geo.page_physical_bytes) == (per_page, segment, physical)
    assert geo.page_of(per_page * 3) == geo.page_of(per_page * 4 - 1) == 3
    assert list(geo.blocks_of(3)) == list(range(per_page * 3, per_page * 4))
    assert sum(r.length for r in geo.page_ranges(3)) == physical


def test_pages_that_do_not_tile_blocks_name_the_setting_to_change() -> None:
    with pytest.raises(ConfigError, match="set page_bytes to a multiple of 32768"):
        Geometry(TINY, KVLayout.UNIFORM, num_blocks=8, page_bytes=24 * KiB)


def test_block_count_must_fill_whole_pages_and_fit_rounds_down() -> None:
    with pytest.raises(ConfigError, match="num_blocks=3 must be a positive multiple of blocks_per_page=2"):
        Geometry(TINY, KVLayout.UNIFORM, num_blocks=3, page_bytes=64 * KiB)
    geo = Geometry.fit(TINY, KVLayout.UNIFORM, 64 * KiB, capacity_bytes=64 * KiB * 10 + 5)
    assert (geo.num_pages, geo.num_blocks, geo.total_bytes) == (10, 20, 640 * KiB)


def test_bad_model_shapes_name_the_field() -> None:
    with pytest.raises(ConfigError, match=r"ModelShape\.num_kv_heads must be > 0"):
        ModelShape(num_layers=2, num_kv_heads=0, head_dim=64, dtype_bytes=2, block_size=16)
    with pytest.raises(ConfigError, match="dtype_bytes must be 1, 2 or 4"):
        ModelShape(num_layers=2, num_kv_heads=2, head_dim=64, dtype_bytes=3, block_size=16)


def test_views_refuse_a_dtype_that_disagrees_with_the_shape() -> None:
    geo = Geometry(TINY, KVLayout.UNIFORM, num_blocks=4, page_bytes=64 * KiB)
    with pytest.raises(ConfigError, match="dtype_bytes=2"):
        layer_views(torch.zeros(geo.total_bytes, dtype=torch.uint8), geo, torch.float32)


SMOLLM2 = ModelShape(num_layers=30, num_kv_heads=3, head_dim=64, dtype_bytes=2, block_size=32)


def test_the_default_page_is_kept_when_the_block_unit_tiles_it() -> None:
    tiny = ModelShape(num_layers=4, num_kv_heads=2, head_dim=64, dtype_bytes=2, block_size=32)  # 16 KiB units
    assert fitting_page_bytes(tiny, KVLayout.PER_LAYER, 4 * KiB, 64 * KiB) == 64 * KiB
    big = ModelShape(num_layers=32, num_kv_heads=8, head_dim=128, dtype_bytes=2, block_size=16)  # 2 MiB blocks
    assert fitting_page_bytes(big, KVLayout.UNIFORM, 2048 * KiB, 2048 * KiB) == 2048 * KiB


def test_three_kv_heads_get_the_smallest_page_of_whole_units_and_os_pages() -> None:
    # 24 KiB per layer and block: 64 KiB does not tile, 72 KiB (three units, 18 OS pages) does
    page = fitting_page_bytes(SMOLLM2, KVLayout.PER_LAYER, 4 * KiB, 64 * KiB)
    assert page == 72 * KiB
    geometry = Geometry.fit(SMOLLM2, KVLayout.PER_LAYER, page, 1 << 30)
    assert geometry.blocks_per_page == 3
    assert geometry.page_physical_bytes == 30 * page


def test_a_page_far_beyond_the_target_is_refused_naming_block_size_and_page_bytes() -> None:
    # a 720 KiB uniform block and 2 MiB CUDA granules meet only at 90 MiB
    with pytest.raises(ConfigError, match=r"block_size.*page_bytes"):
        fitting_page_bytes(SMOLLM2, KVLayout.UNIFORM, 2048 * KiB, 2048 * KiB)
