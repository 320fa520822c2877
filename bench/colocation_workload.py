"""The colocation benchmark's workload: seeded, bursty, the same for every configuration.

Phases alternate which model is busy (``a`` busy, then ``b``, ...); inside a phase, arrivals are a
Poisson process per model (heavy rate for the busy one, light for the other). Half of the busy
model's requests share a long per-model prefix (a system prompt / document), the rest are unique.

    phase:     0          1          2          3
    a:      ########   ..  .  .   ########   .  ..  .
    b:      . .  . .   ########   .. .  .    ########
"""

from __future__ import annotations

import asyncio
import random
import time
from dataclasses import dataclass, field
from typing import Any

import httpx


@dataclass(frozen=True)
class Request:
    at_s: float
    model: str
    prompt: list[int]
    max_tokens: int


@dataclass
class Outcome:
    model: str
    ok: bool
    ttft_s: float = 0.0
    latency_s: float = 0.0
    tokens: int = 0
    error: str = ""
    started_s: float = 0.0


@dataclass(frozen=True)
class WorkloadSpec:
    seed: int = 0
    models: tuple[str, ...] = ("a", "b")
    phases: int = 4
    phase_s: float = 10.0
    heavy_rate: float = 3.0  #: requests per second to the busy model
    light_rate: float = 0.4
    prompt_tokens: tuple[int, int] = (1000, 1600)
    shared_prefix: int = 768
    max_tokens: tuple[int, int] = (24, 64)
    extra: dict[str, Any] = field(default_factory=dict)


def schedule(spec: WorkloadSpec) -> list[Request]:
    rng = random.Random(spec.seed)
    prefixes = {m: [rng.randrange(10, 2000) for _ in range(spec.shared_prefix)] for m in spec.models}
    out = []
    for phase in range(spec.phases):
        busy = spec.models[phase % len(spec.models)]
        for model in spec.models:
            rate = spec.heavy_rate if model == busy else spec.light_rate
            t = phase * spec.phase_s + rng.expovariate(rate)
            while t < (phase + 1) * spec.phase_s:
                n = rng.randint(*spec.prompt_tokens)
                shared = model == busy and rng.random() < 0.5
                head = prefixes[model] if shared else []
                prompt = head + [rng.randrange(10, 2000) for _ in range(n - len(head))]
                out.append(Request(t, model, prompt, rng.randint(*spec.max_tokens)))
                t += rng.expovariate(rate)
    return sorted(out, key=lambda r: r.at_s)


async def one(client: httpx.AsyncClient, url: str, req: Request, t0: float) -> Outcome:
    await asyncio.sleep(max(0.0, t0 + req.at_s - time.monotonic()))
    start = time.monotonic()
    body = {"model": req.model, "prompt": [req.prompt], "max_tokens": req.max_tokens, "ignore_eos": True,
            "stream": True, "stream_options": {"include_usage": True}, "temperature": 0}  # fmt: skip
    first, tokens = None, 0
    try:
        async with client.stream("POST", url + "/v1/completions", json=body) as r:
            if r.status_code != 200:
                return Outcome(req.model, False, error=f"HTTP {r.status_code}", started_s=start - t0)
            async for line in r.aiter_lines():
                if line.startswith("data: ") and line != "data: [DONE]":
                    first = first or time.monotonic()
                    if '"usage":{' in line and '"completion_tokens"' in line:
                        tokens = int(line.split('"completion_tokens":')[1].split(",")[0].split("}")[0])
    except httpx.HTTPError as e:
        return Outcome(req.model, False, error=type(e).__name__, started_s=start - t0)
    end = time.monotonic()
    ok = tokens == req.max_tokens
    return Outcome(req.model, ok, (first or end) - start, end - start, tokens, "" if ok else "short", start - t0)


async def drive(urls: dict[str, str], requests: list[Request], t0: float) -> list[Outcome]:
    limits = httpx.Limits(max_connections=512, max_keepalive_connections=512)
    async with httpx.AsyncClient(timeout=600, limits=limits) as client:
        return list(await asyncio.gather(*(one(client, urls[r.model], r, t0) for r in requests)))
