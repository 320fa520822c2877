"""The colocation benchmark's workloads: seeded, the same for every configuration, their rates
relative to the measured capacity of one engine (``unit``, requests/s), so that the same command
loads any machine of this kind alike.

(a) ``bursts``: two models take turns being busy (``hot`` x unit) while the other idles
    (``cold`` x unit).

        a:  ########  ..  . .  ########  . .. .        b:  the same, one phase later

(b) ``longtail``: three models, popularity 1 : 1/2 : 1/4 of the peak, each ramping up
    0 -> peak -> low on a staggered start (the shape of kvcached's published benchmark).

        a:   /####\\___          b:      /###\\___          c:         /##\\___

(c) ``steady``: every model at a constant rate just under what its static share holds: the
    load does not change, so a policy that moves memory is flapping.

Each rate is a piecewise-constant curve per model; arrivals are a Poisson process inside each
piece. Half of every model's requests share a long per-model prefix (a system prompt).
"""

from __future__ import annotations

import asyncio
import random
import time
from dataclasses import dataclass

import httpx

WORKLOADS = ("bursts", "longtail", "steady")
# Tokens per streamed chunk after the first (vLLM's per-request ``stream_interval``; the first
# token, hence TTFT, is sent at once). One event per token cost the engine's own core a tenth of
# its rate: the whole budget's calibration read 10.0 req/s against 9.05 token by token, at 16 MiB.
STREAM_INTERVAL = 16


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
class Piece:
    start_s: float
    end_s: float
    rate: float  #: requests per second


@dataclass(frozen=True)
class Shape:
    """The requests' sizes, the same in every workload: outputs long enough that a request holds
    its KV for seconds, so that memory, not compute, limits how many run at once. Measured on one
    core without AVX-512 (float32): 16 requests of 150-token prompts and 128 out decode 2.0x as
    fast as 8; with 400-token prompts, 12 decode 1.4x as fast as 6, and the calibration's whole
    budget served 1.17x its half -- attention over the longer contexts, not the pool, bound it.
    (With 600-1000-token prompts and 32-64 out: 1.1-1.4x, prefill bound.)"""

    prompt_tokens: tuple[int, int] = (100, 200)
    shared_prefix: int = 64
    max_tokens: tuple[int, int] = (96, 160)


@dataclass(frozen=True)
class Workload:
    name: str
    curves: dict[str, tuple[Piece, ...]]
    duration_s: float

    @property
    def models(self) -> tuple[str, ...]:
        return tuple(self.curves)

    @property
    def peak_rps(self) -> float:
        """The highest rate any model asks for (the busy model's peak)."""
        return max(p.rate for c in self.curves.values() for p in c)


def bursts(unit: float, hot: float, cold: float, phase_s: float, phases: int = 4) -> Workload:
    curves: dict[str, list[Piece]] = {"a": [], "b": []}
    for p in range(phases):
        for i, m in enumerate(curves):
            rate = hot if p % 2 == i else cold
            curves[m].append(Piece(p * phase_s, (p + 1) * phase_s, rate * unit))
    return Workload("bursts", {m: tuple(c) for m, c in curves.items()}, phases * phase_s)


def longtail(unit: float, hot: float, cold: float, phase_s: float) -> Workload:
    """Per model: ramp up (one phase, in four steps), hold the peak (one phase), fall to the low
    rate; model i starts i phases after the first."""
    curves = {}
    for i, (m, share) in enumerate((("a", 1.0), ("b", 0.5), ("c", 0.25))):
        peak, t0 = max(cold, hot * share) * unit, i * phase_s
        ramp = tuple(Piece(t0 + k * phase_s / 4, t0 + (k + 1) * phase_s / 4, peak * (k + 1) / 4) for k in range(4))
        low_start = t0 + 2 * phase_s
        curves[m] = (Piece(0, t0, cold * unit), *ramp, Piece(t0 + phase_s, low_start, peak),
                     Piece(low_start, 4 * phase_s, cold * unit))  # fmt: skip
    return Workload("longtail", {m: tuple(p for p in c if p.end_s > p.start_s) for m, c in curves.items()},
                    4 * phase_s)  # fmt: skip


def steady(unit: float, rate: float, duration_s: float) -> Workload:
    return Workload("steady", {m: (Piece(0, duration_s, rate * unit),) for m in ("a", "b")}, duration_s)


def schedule(workload: Workload, shape: Shape, seed: int) -> list[Request]:
    rng = random.Random(seed)
    prefixes = {m: [rng.randrange(10, 2000) for _ in range(shape.shared_prefix)] for m in workload.models}
    out = []
    for model, pieces in workload.curves.items():
        for piece in pieces:
            if piece.rate <= 0:
                continue
            t = piece.start_s + rng.expovariate(piece.rate)
            while t < piece.end_s:
                n = rng.randint(*shape.prompt_tokens)
                head = prefixes[model] if rng.random() < 0.5 else []
                prompt = head + [rng.randrange(10, 2000) for _ in range(n - len(head))]
                out.append(Request(t, model, prompt, rng.randint(*shape.max_tokens)))
                t += rng.expovariate(piece.rate)
    return sorted(out, key=lambda r: r.at_s)


async def one(client: httpx.AsyncClient, url: str, req: Request, t0: float) -> Outcome:
    await asyncio.sleep(max(0.0, t0 + req.at_s - time.monotonic()))
    start = time.monotonic()
    body = {"model": req.model, "prompt": [req.prompt], "max_tokens": req.max_tokens, "ignore_eos": True,
            "stream": True, "stream_options": {"include_usage": True}, "temperature": 0,
            "stream_interval": STREAM_INTERVAL}  # fmt: skip
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


async def drive(urls: dict[str, str], requests: list[Request], t0: float, deadline_s: float) -> list[Outcome]:
    """Every request at its time; one still unanswered ``deadline_s`` after the start fails (a
    starved model must not hold the benchmark forever)."""
    limits = httpx.Limits(max_connections=1024, max_keepalive_connections=1024)

    async def bounded(client: httpx.AsyncClient, r: Request) -> Outcome:
        try:
            return await asyncio.wait_for(one(client, urls[r.model], r, t0), t0 + deadline_s - time.monotonic())
        except TimeoutError:
            return Outcome(r.model, False, error="deadline", started_s=r.at_s)

    async with httpx.AsyncClient(timeout=600, limits=limits) as client:
        return list(await asyncio.gather(*(bounded(client, r) for r in requests)))
