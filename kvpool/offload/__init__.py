"""The CPU offload tier: a bounded host block store and whole-block transfers (no vLLM here)."""

from kvpool.offload.store import (
    TIER_FILES,
    BlockRegion,
    HostBlockStore,
    StoreDamaged,
    copy_blocks,
    reap_stale,
    stale_files,
)

__all__ = ["TIER_FILES", "BlockRegion", "HostBlockStore", "StoreDamaged", "copy_blocks", "reap_stale", "stale_files"]
