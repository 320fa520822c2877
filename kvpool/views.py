"""Per-layer tensor views over the pool's buffer, in vLLM's convention.

Each view is ``[num_blocks, H, N, 2 * head_dim]`` in the model dtype (K in the first ``head_dim``
channels, V in the rest), exactly what ``vllm.v1.kv_cache_interface.create_kv_cache_views``
builds from the same ``layer_stride`` / ``block_stride``. Only the inner ``H``/``N`` order
differs by layout: ``[H, N]`` for LBHNC, ``[N, H]`` for BLNHC (strides, not copies).
"""

from __future__ import annotations

import torch

from kvpool.errors import ConfigError
from kvpool.layout import Geometry, KVLayout

_DTYPES = {torch.float32: 4, torch.bfloat16: 2, torch.float16: 2, torch.float8_e4m3fn: 1, torch.uint8: 1}


def layer_views(buffer: torch.Tensor, geometry: Geometry, dtype: torch.dtype) -> list[torch.Tensor]:
    """One strided view per layer over ``buffer`` (a flat ``uint8`` tensor of the pool)."""
    s = geometry.shape
    if _DTYPES.get(dtype) != s.dtype_bytes:
        raise ConfigError(f"dtype {dtype} does not match ModelShape.dtype_bytes={s.dtype_bytes}")
    if buffer.dtype != torch.uint8 or buffer.dim() != 1 or buffer.numel() < geometry.total_bytes:
        raise ConfigError(f"buffer must be a flat uint8 tensor of at least {geometry.total_bytes} bytes")
    c = s.cell_bytes
    if geometry.layout is KVLayout.UNIFORM:  # [N, H, C] inside a layer page
        h_stride, n_stride = c, s.num_kv_heads * c
    else:  # [H, N, C]
        h_stride, n_stride = s.block_size * c, c
    size = (geometry.num_blocks, s.num_kv_heads, s.block_size, c)
    stride = (geometry.block_stride, h_stride, n_stride, 1)
    return [
        torch.as_strided(buffer, size, stride, storage_offset=layer * geometry.layer_stride).view(dtype)
        for layer in range(s.num_layers)
    ]
