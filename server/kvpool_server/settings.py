"""ServerSettings: every option of kvpool-server, from flags or ``KVPOOL_*`` environment, validated
once at start. ``kvpool-server --help`` lists them with these descriptions; the pool's options
(``POOL_FIELDS``) take theirs from ``PoolEngineConfig``, where they are defined, and reach it by
name (``kvpool_server.cli.pool_config``)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Annotated, Literal

from pydantic import BeforeValidator, Field, SecretStr, model_validator
from pydantic_settings import SettingsConfigDict

from kvpool.docstrings import attribute_docs
from kvpool.units import parse_bytes
from kvpool.vllm.launch.args import PoolEngineConfig
from kvpool_server.flags import AdminTokenOptions

#: options that are PoolEngineConfig fields of the same name and type (copied by name)
POOL_FIELDS = ("limit_bytes", "virtual_bytes", "block_size", "page_bytes", "tensor_parallel_size", "offload_bytes",
               "offload_policy", "ledger_bytes", "ledger_path", "preempt_after_s")  # fmt: skip


def engine_doc(name: str, example: str = "") -> str:
    """The description of a pool option: the engine config's own docstring (+ an example)."""
    doc = attribute_docs(PoolEngineConfig)[name]
    return f"{doc} ({example})" if example else doc


def _bytes(value: object) -> object:
    return parse_bytes(value) if isinstance(value, str) else value


Bytes = Annotated[int, BeforeValidator(_bytes)]
DEFAULT_CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "kvpool"


class ServerSettings(AdminTokenOptions):
    """kvpool-server: serve one model over the OpenAI HTTP API with an elastic KV pool."""

    model_config = SettingsConfigDict(
        env_prefix="KVPOOL_", extra="forbid", cli_kebab_case=True, cli_prog_name="kvpool-server"
    )

    model: str = Field("", description="model path or cached id; empty = the embedded tiny model built locally")
    served_model_name: str = Field("", description="name clients use (default: the model directory's name)")
    host: str = Field("127.0.0.1", description="address to listen on")
    port: int = Field(8000, ge=1, le=65535, description="HTTP port of the OpenAI API")
    admin_port: int = Field(
        8100, ge=1, le=65535, description="HTTP port of the /kvpool admin routes (resize, trim, integrity), on the "
        "same host: keep it private (the chart's NetworkPolicy lets only the operator reach it)",
    )  # fmt: skip
    backend: Literal["host", "cuda"] = Field("host", description=engine_doc("backend"))
    limit_bytes: Bytes = Field(256 << 20, gt=0, description=engine_doc("limit_bytes", "256Mi, 4Gi"))
    virtual_bytes: Bytes = Field(2 << 30, gt=0, description=engine_doc("virtual_bytes", "e.g. 2Gi"))
    block_size: int = Field(32, gt=0, description=engine_doc("block_size"))
    page_bytes: Bytes = Field(0, ge=0, description=engine_doc("page_bytes"))
    offload_bytes: Bytes = Field(0, ge=0, description=engine_doc("offload_bytes", "e.g. 4Gi"))
    offload_policy: Literal["lru", "arc"] = Field("lru", description=engine_doc("offload_policy"))
    offload_dir: Path = Field(Path("/dev/shm"), description=engine_doc("offload_dir", "a memory-backed volume"))
    ledger_bytes: Bytes = Field(0, ge=0, description=engine_doc("ledger_bytes", "e.g. 8Gi"))
    ledger_path: str = Field("/dev/shm/kvpool-ledger", min_length=1, description=engine_doc("ledger_path"))
    preempt_after_s: float | None = Field(0.5, ge=0, description=engine_doc("preempt_after_s"))
    max_model_len: int = Field(2048, gt=0, description="longest prompt + output in tokens")
    tensor_parallel_size: int = Field(1, ge=1, description=engine_doc("tensor_parallel_size"))
    enforce_eager: bool | None = Field(
        None, description="skip torch.compile / CUDA graphs; default: on with backend host (the CPU), off with "
        "cuda (CUDA graphs, vLLM's own default; the pool's virtual range never moves)",
    )  # fmt: skip
    api_key: SecretStr | None = Field(None, description="key the OpenAI routes require (vLLM's --api-key)")
    grace_period_s: float = Field(30.0, ge=0, description="SIGTERM: seconds to finish in-flight requests")
    log_json: bool = Field(False, description="one JSON object per log line")
    vllm_args: str = Field("", description="extra vLLM serve flags, shell-quoted (e.g. '--seed 1')")
    model_cache: Path = Field(DEFAULT_CACHE, description="where the embedded tiny model is built")

    @model_validator(mode="after")
    def _check(self) -> ServerSettings:
        if self.admin_port == self.port:
            raise ValueError(f"admin-port and port are both {self.port}: the admin API needs a port of its own")
        if self.limit_bytes > self.virtual_bytes:
            raise ValueError(f"limit-bytes ({self.limit_bytes}) must not exceed virtual-bytes ({self.virtual_bytes})")
        if self.offload_bytes and not self.offload_dir.is_dir():
            raise ValueError(f"offload-dir {self.offload_dir} is not a directory (the CPU tier's file goes there)")
        # each worker reserves its tier at start: a directory too small is said now, before the engine loads.
        # Files of dead workers count as room: each worker removes them before it reserves (in a pod,
        # /dev/shm outlives a container restart, with the killed container's tier in it)
        need = self.offload_bytes * self.tensor_parallel_size
        if need:
            from kvpool.offload import stale_files  # here: it loads torch, which a server without a tier need not

            free = shutil.disk_usage(self.offload_dir).free + sum(
                p.stat().st_blocks * 512 for p in stale_files(self.offload_dir)
            )
            if need > free:
                raise ValueError(f"offload-bytes: the CPU tier needs {need} bytes in offload-dir {self.offload_dir}, "
                                 f"which has {free} free: lower it or give the directory more room")  # fmt: skip
        return self

    @property
    def eager(self) -> bool:
        return self.enforce_eager if self.enforce_eager is not None else self.backend == "host"
