"""ConnectorSettings: the pool's part of vLLM's ``kv_connector_extra_config``, validated once.

Every engine process (API server, engine core, workers) parses the same JSON, so a bad value
fails at start-up with the key's name instead of at the first resize.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

from kvpool.errors import ConfigError
from kvpool.vmm.base import BackendKind

#: where vLLM's offloading connector finds our spec (a string: a test keeps it equal to the
#: class's __module__; importing the spec here would import vLLM)
TIER_SPEC = ("kvpool.vllm.tier.worker", "KVPoolOffloadingSpec")

KiB, MiB = 1 << 10, 1 << 20
#: vLLM's eviction policies for a full tier; the one list every layer checks against
OFFLOAD_POLICIES = ("lru", "arc")


@dataclass(frozen=True)
class ConnectorSettings:
    """Settings of the pool inside one engine (the same on every tensor-parallel rank)."""

    limit_bytes: int
    """Physical KV bytes the pool may back per worker at start (changed later by resize)."""
    page_bytes: int
    """Mapping granule per layer region (host: a multiple of 4 KiB; CUDA: of 2 MiB). No default
    here: ``PoolEngineConfig`` decides it once (0 there = the default the model's blocks tile)."""
    backend: BackendKind = BackendKind.HOST
    """``host`` on CPU engines, ``cuda`` on GPU engines."""
    grow_ahead_blocks: int = 0
    """Free blocks to keep mapped ahead of demand while the limit allows; 0 = half a step's worth
    of prefill (max_num_batched_tokens / block_size / 2), at least two pages."""
    control_address: str = ""
    """Abstract Unix socket name of the control channel; empty = no channel."""
    model: str = "default"
    """Name reported in snapshots and metric labels."""
    control_timeout_s: float = 30.0
    """How long a control request may wait for the engine loop before it fails."""
    offload_bytes: int = 0
    """Size of the CPU offload tier per worker; 0 = no tier (and no cost)."""
    offload_policy: str = "lru"
    """Eviction policy of a full tier: ``lru`` or ``arc`` (vLLM's policies)."""
    offload_dir: str = "/dev/shm"
    """Directory of the tier's shared-memory file (in Kubernetes: a memory-backed emptyDir)."""
    ledger_bytes: int = 0
    """The node ledger's budget (``kvpool.ledger``) for every pool sharing ``ledger_path`` on one
    device; 0 = no ledger."""
    ledger_path: str = "/dev/shm/kvpool-ledger"
    """The ledger's file; each device gets its own (``<path>-dev<N>``)."""
    preempt_after_s: float | None = 0.5
    """A shrink deferred this long preempts the running requests that hold its pages (they
    resume from what stays cached); ``None`` = never: pages drain as their requests finish."""

    def __post_init__(self) -> None:
        if self.limit_bytes < 0:
            raise ConfigError(f"kvpool limit_bytes must be >= 0, got {self.limit_bytes}")
        if self.page_bytes <= 0 or self.page_bytes % (4 * KiB):
            raise ConfigError(f"kvpool page_bytes={self.page_bytes} must be a positive multiple of 4096")
        if self.backend is BackendKind.CUDA and self.page_bytes % (2 * MiB):
            raise ConfigError(f"kvpool page_bytes={self.page_bytes} must be a multiple of 2 MiB with backend=cuda")
        if self.grow_ahead_blocks < 0:
            raise ConfigError(f"kvpool grow_ahead_blocks must be >= 0, got {self.grow_ahead_blocks}")
        if self.control_timeout_s <= 0:
            raise ConfigError(f"kvpool control_timeout_s must be > 0, got {self.control_timeout_s}")
        if self.offload_bytes < 0:
            raise ConfigError(f"kvpool offload_bytes must be >= 0, got {self.offload_bytes}")
        if self.ledger_bytes < 0:
            raise ConfigError(f"kvpool ledger_bytes must be >= 0, got {self.ledger_bytes}")
        if self.preempt_after_s is not None and not self.preempt_after_s >= 0:
            raise ConfigError(f"kvpool preempt_after_s must be >= 0 or null, got {self.preempt_after_s}")
        if self.offload_policy not in OFFLOAD_POLICIES:
            raise ConfigError(f"kvpool offload_policy must be one of {OFFLOAD_POLICIES}, got {self.offload_policy!r}")

    @classmethod
    def from_extra(cls, extra: Mapping[str, Any] | None) -> ConnectorSettings:
        """Parse ``kv_connector_extra_config["kvpool"]``; unknown keys are errors."""
        raw = dict((extra or {}).get("kvpool") or {})
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(raw) - known)
        if unknown:
            raise ConfigError(f"unknown kvpool settings {unknown}; known: {sorted(known)}")
        for key in ("limit_bytes", "page_bytes"):
            if key not in raw:
                raise ConfigError(f"kv_connector_extra_config.kvpool.{key} is required")
        try:
            if "backend" in raw:
                raw["backend"] = BackendKind(raw["backend"])
            for key in ("limit_bytes", "page_bytes", "grow_ahead_blocks", "offload_bytes", "ledger_bytes"):
                if key in raw and (not isinstance(raw[key], int) or isinstance(raw[key], bool)):
                    raise ConfigError(f"kvpool {key} must be an integer, got {raw[key]!r}")
            after = raw.get("preempt_after_s")
            if after is not None and (not isinstance(after, int | float) or isinstance(after, bool)):
                raise ConfigError(f"kvpool preempt_after_s must be a number of seconds or null, got {after!r}")
            return cls(**raw)
        except ValueError as e:
            raise ConfigError(f"bad kvpool setting: {e}") from e

    def to_extra(self) -> dict[str, Any]:
        """The JSON form that ``from_extra`` reads back, plus the keys vLLM's offloading connector
        reads when the tier is on (our spec, its size, its eviction policy)."""
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        out["backend"] = self.backend.value
        return {"kvpool": out, **self.tier_extra()}

    def tier_extra(self) -> dict[str, Any]:
        if not self.offload_bytes:
            return {}
        return {
            "spec_name": TIER_SPEC[1],
            "spec_module_path": TIER_SPEC[0],
            "cpu_bytes_to_use": self.offload_bytes,
            "eviction_policy": self.offload_policy,
        }
