"""Derive the pool's Geometry from vLLM's KVCacheConfig, and check that both agree byte for byte."""

from __future__ import annotations

from typing import Any

from kvpool.errors import ConfigError
from kvpool.layout import Geometry, KVLayout, ModelShape


def geometry_from_kv_cache_config(kv_cache_config: Any, page_bytes: int) -> Geometry:
    """The Geometry that matches vLLM's single backing allocation, or a ConfigError saying why not.

    Supported: one KV cache group of full attention (all layers the same shape) in one shared
    allocation -- dense decoder models such as Llama, Qwen, Mistral.
    """
    groups = kv_cache_config.kv_cache_groups
    tensors = kv_cache_config.kv_cache_tensors
    if len(groups) != 1 or len(tensors) != 1:
        raise ConfigError(
            f"kvpool supports one KV cache group in one allocation; this model has {len(groups)} groups and "
            f"{len(tensors)} tensors (hybrid or sliding-window models are not supported yet)"
        )
    spec, tensor = groups[0].kv_cache_spec, tensors[0]
    for attr in ("num_kv_heads", "head_size", "dtype", "block_size"):
        if not hasattr(spec, attr):
            raise ConfigError(f"kvpool needs an attention KV spec; got {type(spec).__name__}")
    if getattr(spec, "head_size_v", spec.head_size) != spec.head_size or getattr(spec, "page_size_padded", None):
        raise ConfigError("kvpool needs K and V of the same head size and unpadded pages")
    shape = ModelShape(
        num_layers=len(tensor.layers),
        num_kv_heads=spec.num_kv_heads,
        head_dim=spec.head_size,
        dtype_bytes=spec.dtype.itemsize,
        block_size=spec.block_size,
    )
    layout = KVLayout.UNIFORM if tensor.layer_stride < tensor.block_stride else KVLayout.PER_LAYER
    geometry = Geometry(shape, layout, kv_cache_config.num_blocks, page_bytes)
    expected = (geometry.layer_stride, geometry.block_stride, 0, geometry.total_bytes)
    actual = (tensor.layer_stride, tensor.block_stride, tensor.offset, tensor.size)
    if expected != actual:
        raise ConfigError(
            f"vLLM's KV allocation (layer_stride, block_stride, offset, size) = {actual} differs from kvpool's "
            f"{layout.value} geometry {expected}; use VLLM_KV_CACHE_LAYOUT=BLNHC (GPU) or LBHNC (CPU)"
        )
    return geometry
