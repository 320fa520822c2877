"""Calibrate the colocation benchmark to this machine: how many requests per second one pinned
engine completes with its static share of the budget, and with the whole budget (closed loop,
enough clients to keep the pool full). The workloads' rates are set from these two, so that the
busy model asks for more than its share can serve and less than its core can compute -- on any
machine of this kind. If the whole budget serves no more than the share, memory is not what
limits this shape here, and the report says so.
"""

from __future__ import annotations

import asyncio
import math
import random
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

from bench.colocation_configs import Config, Setup, start_servers
from bench.colocation_workload import Request, Shape, one

WARM_S, WINDOW_S = 5.0, 20.0  #: every closed-loop measure's warm-up and window: calibration and remeasure compare
BLOCK_TOKENS = 32  #: kvpool-server's default --block-size


@dataclass(frozen=True)
class Capacity:
    shares_rps: dict[int, float]  #: N -> requests/s with budget / N (every workload's N)
    full_rps: float  #: requests/s with the whole budget
    request_bytes: int  #: KV bytes of an average request
    clients: int

    def share_rps(self, n: int) -> float:
        return self.shares_rps[n]

    @property
    def memory_bound(self) -> bool:
        return all(self.full_rps > 1.15 * rps for rps in self.shares_rps.values())


async def closed_loop(url: str, model: str, shape: Shape, clients: int, seconds: float, seed: int) -> float:
    """Completed requests per second with ``clients`` requests always in flight."""
    rng = random.Random(seed)
    done = 0
    t0 = time.monotonic()
    deadline = t0 + seconds

    async def worker(client: httpx.AsyncClient) -> None:
        nonlocal done
        while time.monotonic() < deadline:
            prompt = [rng.randrange(10, 2000) for _ in range(rng.randint(*shape.prompt_tokens))]
            out = await one(client, url, Request(0, model, prompt, rng.randint(*shape.max_tokens)), t0)
            done += out.ok and time.monotonic() <= deadline

    async with httpx.AsyncClient(timeout=600) as client:
        await asyncio.gather(*(worker(client) for _ in range(clients)))
    return done / seconds


async def _set_limit(url: str, limit: int) -> None:
    async with httpx.AsyncClient(timeout=60) as client:
        revision = (await client.get(url + "/kvpool")).json()["pending"]["revision"] + 1
        r = await client.put(url + "/kvpool/limit", json={"limit_bytes": limit, "revision": revision})
        r.raise_for_status()


def calibrate(setup: Setup, n_models: tuple[int, ...], shape: Shape, tmp: Path, seconds: float = WINDOW_S) -> Capacity:
    """One engine on core 0 (the other cores idle), first with the whole budget, then with the
    static share of each group size in ``n_models`` (a workload's rates follow its own share)."""
    servers = start_servers(setup, Config("static", False), ("a",), tmp)  # one model: limit = budget
    proc, ep, url = servers["a"]
    try:
        block_bytes = int(httpx.get(ep.url + "/kvpool", timeout=30).json()["block_bytes"])
        tokens = sum(shape.prompt_tokens) / 2 + sum(shape.max_tokens) / 2
        request_bytes = math.ceil(tokens / BLOCK_TOKENS) * block_bytes
        clients = max(4, 2 * setup.budget // request_bytes)
        asyncio.run(closed_loop(url, "a", shape, clients, WARM_S, seed=1))  # warm-up
        full = asyncio.run(closed_loop(url, "a", shape, clients, seconds, seed=2))
        shares = {}
        for n in sorted(set(n_models)):
            asyncio.run(_set_limit(ep.url, setup.budget // n))  # the admin port
            shares[n] = asyncio.run(closed_loop(url, "a", shape, clients, seconds, seed=2 + n))
    finally:
        proc.terminate()
        proc.wait(timeout=120)
    return Capacity(shares, full, request_bytes, clients)


DRIFT = 0.2  #: a machine whose speed moved more than this within a run is flagged in the report


def remeasure(setup: Setup, cap: Capacity, shape: Shape, tmp: Path, seconds: float = WINDOW_S) -> float:
    """The whole budget's rate again (after a workload): the calibration holds only while the
    machine keeps its speed, and a VM's can move by half within an hour. The same warm-up and
    window as the calibration's, so the two compare: with 28 clients a request takes seconds
    under load, and a window of 10 s after a 3-s warm-up read 0 req/s in a quick run."""
    servers = start_servers(setup, Config("static", False), ("a",), tmp)
    proc, _, url = servers["a"]
    try:
        asyncio.run(closed_loop(url, "a", shape, cap.clients, WARM_S, seed=1))  # warm-up
        return asyncio.run(closed_loop(url, "a", shape, cap.clients, seconds, seed=2))
    finally:
        proc.terminate()
        proc.wait(timeout=120)


def drift_line(cap: Capacity, after: dict[str, float]) -> str:
    """One line for the report: the machine's speed after each workload against the calibration."""
    moves = {w: rps / cap.full_rps - 1 for w, rps in after.items()}
    cells = ", ".join(f"after {w} {after[w]:.2f} ({m:+.0%})" for w, m in moves.items())
    flagged = [w for w, m in moves.items() if abs(m) > DRIFT]
    verdict = (f"MOVED more than {DRIFT:.0%} around {', '.join(flagged)}: its rates no longer fit the machine"
               if flagged else f"steady within {DRIFT:.0%}")  # fmt: skip
    return f"machine speed (req/s, whole budget): calibration {cap.full_rps:.2f}, {cells} -- {verdict}"
