"""KV-cache geometry: where every layer of every block lives, and which blocks share a page.

Pure arithmetic (no torch, no CUDA), matching vLLM 0.32's ``KVCacheTensor`` convention: layer
``l``'s page for block ``b`` starts at ``l * layer_stride + b * block_stride`` and holds one
``[H, N, C]`` cell grid, ``C = 2 * head_dim * dtype_bytes`` (K and V side by side).

Uniform cross-layer (``BLNHC``, block-outermost) -- one block is one contiguous run::

    | block 0: L0 L1 .. L(L-1) | block 1: L0 L1 .. | ... |     layer_stride = layer_page
      <------ block_bytes ----->                              block_stride = L * layer_page
    | pool page 0 = blocks 0..k-1 | pool page 1 | ...         one range per pool page

Per-layer (``LBHNC``, layer-outermost) -- vLLM's CPU attention accepts only this one::

    | layer 0: b0 b1 b2 .. | layer 1: b0 b1 b2 .. | ... |     layer_stride = num_blocks * layer_page
      [seg p ]               [seg p ]                         block_stride = layer_page
    pool page p = segment p of every layer region: L ranges mapped and unmapped together

Blocks never straddle mapping pages: either a page holds whole blocks (page = k x unit) or a unit
spans whole pages (unit = k x page), where the unit is a whole block (uniform) or one layer's page
of a block (per-layer).
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass
from typing import NamedTuple, NewType

from kvpool.errors import ConfigError

BlockId = NewType("BlockId", int)
PageId = NewType("PageId", int)


class KVLayout(enum.Enum):
    """Physical order of the KV cache, named as vLLM's ``KVCacheLayout``."""

    UNIFORM = "BLNHC"  #: block-outermost: a block holds all layers contiguously
    PER_LAYER = "LBHNC"  #: layer-outermost: one region per layer


class ByteRange(NamedTuple):
    """A half-open byte range ``[offset, offset + length)`` in the pool's virtual buffer."""

    offset: int
    length: int


@dataclass(frozen=True)
class ModelShape:
    """The attention shape of one model, as it determines KV bytes."""

    num_layers: int
    """Attention layers whose KV lives in the pool."""
    num_kv_heads: int
    """KV heads per layer on this worker (after tensor-parallel sharding)."""
    head_dim: int
    """Channels per head, for K and for V."""
    dtype_bytes: int
    """Bytes per element (2 for bf16/fp16, 4 for fp32, 1 for fp8)."""
    block_size: int
    """Tokens per KV block (vLLM ``--block-size``)."""

    def __post_init__(self) -> None:
        for name in ("num_layers", "num_kv_heads", "head_dim", "block_size"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"ModelShape.{name} must be > 0, got {getattr(self, name)}")
        if self.dtype_bytes not in (1, 2, 4):
            raise ConfigError(f"ModelShape.dtype_bytes must be 1, 2 or 4, got {self.dtype_bytes}")

    @property
    def cell_bytes(self) -> int:
        """C: one token's K and V for one head."""
        return 2 * self.head_dim * self.dtype_bytes

    @property
    def layer_page_bytes(self) -> int:
        """One layer's share of one block: ``H * N * C``."""
        return self.num_kv_heads * self.block_size * self.cell_bytes

    @property
    def block_bytes(self) -> int:
        """One block across all layers."""
        return self.num_layers * self.layer_page_bytes


@dataclass(frozen=True)
class Geometry:
    """A model's KV cache laid out over ``num_blocks`` blocks and pages of ``page_bytes``."""

    shape: ModelShape
    layout: KVLayout
    num_blocks: int
    """Virtual block count (what vLLM is told); a multiple of ``blocks_per_page``."""
    page_bytes: int
    """Mapping granule of the backend page (2 MiB on CUDA; any OS-page multiple on the host)."""

    def __post_init__(self) -> None:
        if self.page_bytes <= 0:
            raise ConfigError(f"page_bytes must be > 0, got {self.page_bytes}")
        unit, page = self._unit_bytes, self.page_bytes
        if page % unit and unit % page:
            raise ConfigError(
                f"a {self.layout.name} block unit of {unit} bytes does not tile pages of {page} bytes: "
                f"set page_bytes to a multiple of {unit} or a divisor of it, or change block_size"
            )
        if self.num_blocks <= 0 or self.num_blocks % self.blocks_per_page:
            raise ConfigError(
                f"num_blocks={self.num_blocks} must be a positive multiple of blocks_per_page="
                f"{self.blocks_per_page}; use Geometry.fit() to round a byte capacity"
            )

    @classmethod
    def fit(cls, shape: ModelShape, layout: KVLayout, page_bytes: int, capacity_bytes: int) -> Geometry:
        """The largest geometry whose buffer fits in ``capacity_bytes`` (whole pages only)."""
        probe = cls(shape, layout, _probe_blocks(shape, layout, page_bytes), page_bytes)
        pages = capacity_bytes // probe.page_physical_bytes
        if pages < 2:
            raise ConfigError(
                f"virtual capacity {capacity_bytes} bytes holds fewer than 2 pages of "
                f"{probe.page_physical_bytes} bytes; raise virtual_bytes"
            )
        return cls(shape, layout, pages * probe.blocks_per_page, page_bytes)

    @property
    def _unit_bytes(self) -> int:
        """The indivisible piece of one block in one region."""
        if self.layout is KVLayout.UNIFORM:
            return self.shape.block_bytes
        return self.shape.layer_page_bytes

    @property
    def blocks_per_page(self) -> int:
        """Blocks that share one pool page (at least 1)."""
        return max(1, self.page_bytes // self._unit_bytes)

    @property
    def segment_bytes(self) -> int:
        """Bytes of one mapped range of a pool page (a whole page, or a unit spanning pages)."""
        return max(self.page_bytes, self._unit_bytes)

    @property
    def num_pages(self) -> int:
        return self.num_blocks // self.blocks_per_page

    @property
    def page_physical_bytes(self) -> int:
        """Physical memory one pool page costs: one segment, or one per layer region."""
        regions = 1 if self.layout is KVLayout.UNIFORM else self.shape.num_layers
        return regions * self.segment_bytes

    @property
    def total_bytes(self) -> int:
        """Size of the whole virtual buffer."""
        return self.num_blocks * self.shape.block_bytes

    @property
    def layer_stride(self) -> int:
        if self.layout is KVLayout.UNIFORM:
            return self.shape.layer_page_bytes
        return self.num_blocks * self.shape.layer_page_bytes

    @property
    def block_stride(self) -> int:
        if self.layout is KVLayout.UNIFORM:
            return self.shape.block_bytes
        return self.shape.layer_page_bytes

    def page_of(self, block: BlockId) -> PageId:
        self._check_block(block)
        return PageId(block // self.blocks_per_page)

    def blocks_of(self, page: PageId) -> range:
        self._check_page(page)
        return range(page * self.blocks_per_page, (page + 1) * self.blocks_per_page)

    def page_ranges(self, page: PageId) -> list[ByteRange]:
        """The ranges mapped together for ``page``: 1 (uniform) or ``num_layers`` (per-layer)."""
        self._check_page(page)
        start = page * self.blocks_per_page * self.block_stride
        if self.layout is KVLayout.UNIFORM:
            return [ByteRange(start, self.segment_bytes)]
        return [ByteRange(lay * self.layer_stride + start, self.segment_bytes) for lay in range(self.shape.num_layers)]

    def block_ranges(self, block: BlockId) -> list[ByteRange]:
        """Where ``block``'s bytes live: 1 contiguous range (uniform) or one per layer."""
        self._check_block(block)
        if self.layout is KVLayout.UNIFORM:
            return [ByteRange(block * self.block_stride, self.shape.block_bytes)]
        lp = self.shape.layer_page_bytes
        return [ByteRange(lay * self.layer_stride + block * lp, lp) for lay in range(self.shape.num_layers)]

    def cell_offset(self, layer: int, block: BlockId, head: int, token: int) -> int:
        """Byte offset of one ``(layer, block, head, token)`` cell (K then V, ``C`` bytes)."""
        self._check_block(block)
        s = self.shape
        if not (0 <= layer < s.num_layers and 0 <= head < s.num_kv_heads and 0 <= token < s.block_size):
            raise ConfigError(f"cell ({layer}, {block}, {head}, {token}) is outside the model shape")
        base = layer * self.layer_stride + block * self.block_stride
        if self.layout is KVLayout.UNIFORM:  # [N, H, C] inside a layer page
            return base + (token * s.num_kv_heads + head) * s.cell_bytes
        return base + (head * s.block_size + token) * s.cell_bytes  # [H, N, C]

    def _check_block(self, block: int) -> None:
        if not 0 <= block < self.num_blocks:
            raise ConfigError(f"block {block} is outside 0..{self.num_blocks - 1}")

    def _check_page(self, page: int) -> None:
        if not 0 <= page < self.num_pages:
            raise ConfigError(f"page {page} is outside 0..{self.num_pages - 1}")


def fitting_page_bytes(shape: ModelShape, layout: KVLayout, granule: int, target: int) -> int:
    """The page to use when none is set: ``target`` if the layout's block unit tiles it, else the
    smallest multiple of both the unit and the backend's ``granule`` that is at least ``target``.

    Models whose KV heads are not powers of two (SmolLM2: 3 heads x 30 layers) have units that no
    power-of-two page tiles; a page of whole units keeps every block in whole pages. Past 16x the
    target the granularity of the limit would suffer, so that is refused with the way out.
    """
    unit = shape.block_bytes if layout is KVLayout.UNIFORM else shape.layer_page_bytes
    if target % unit == 0 or unit % target == 0:
        return target
    step = math.lcm(unit, granule)
    page = -(-target // step) * step
    if page > 16 * target:
        raise ConfigError(
            f"a {layout.name} block unit of {unit} bytes ({shape.block_size} tokens) tiles no page near {target} "
            f"bytes (the smallest is {page}): choose block_size so a block is a divisor or multiple of {granule} "
            f"bytes, or set page_bytes"
        )
    return page


def _probe_blocks(shape: ModelShape, layout: KVLayout, page_bytes: int) -> int:
    unit = shape.block_bytes if layout is KVLayout.UNIFORM else shape.layer_page_bytes
    return max(1, page_bytes // unit)
