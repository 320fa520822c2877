"""The CPU offload tier: a bounded host block store and whole-block transfers (no vLLM here)."""

from kvpool.offload.store import BlockRegion, HostBlockStore, StoreDamaged, copy_blocks

__all__ = ["BlockRegion", "HostBlockStore", "StoreDamaged", "copy_blocks"]
