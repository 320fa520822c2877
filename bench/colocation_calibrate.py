"""Calibrate the colocation benchmark to this machine: how many requests per second one pinned
engine completes with its static share of the budget, and with the whole budget (closed loop,
enough clients to keep the pool full). The workloads' rates are set from these two, so that the
busy model asks for more than its share can serve and less than its core can compute -- on any
machine of this kind. If the whole budget serves no more than the share, memory is not what
limits this shape here, and the report says so.

The machine's own speed moves by more than the load's margin: ten 20-s windows of one engine,
twice, served 7.2-10.0 req/s with the whole budget and 5.4-7.2 with half of it (Little's law on
the requests' latencies agreed with the count within 2%: the speed moved, not the count), and
three one-window calibrations back to back set the bursts' busy rate at 8.1, 7.3 and 6.1 req/s:
against half's median over those windows (~6 req/s), static's share overloaded by a third, by a
fifth, or not at all. So every measure is taken ``ROUNDS`` times, interleaved, the order reversed
every other round (a speed that drifts linearly weighs on every measure alike), and its median
is the rate; the report shows each measure's range beside it.
"""

from __future__ import annotations

import asyncio
import math
import random
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from bench.colocation_configs import Config, Setup, start_servers
from bench.colocation_workload import Request, Shape, one

WARM_S, WINDOW_S = 5.0, 20.0  #: every closed-loop measure's warm-up and window (calibration and remeasure)
BLOCK_TOKENS = 32  #: kvpool-server's default --block-size
ROUNDS = 4  #: windows per measure: with the order reversed every other round, an even number cancels a linear drift
WHOLE = 1  #: the whole budget's key among the measures (budget / 1)


@dataclass(frozen=True)
class Capacity:
    shares_rps: dict[int, float]  #: N -> requests/s with budget / N (every workload's N)
    full_rps: float  #: requests/s with the whole budget
    request_bytes: int  #: KV bytes of an average request
    clients: int
    windows: dict[int, tuple[float, ...]] = field(default_factory=dict)  #: N -> every window's rate (1: whole)

    def share_rps(self, n: int) -> float:
        return self.shares_rps[n]

    @property
    def memory_bound(self) -> bool:
        return all(self.full_rps > 1.15 * rps for rps in self.shares_rps.values())

    def line(self) -> str:
        """The report's calibration line: each measure's median and the range of its windows."""
        rates = {WHOLE: self.full_rps, **self.shares_rps}

        def cell(n: int) -> str:
            got = self.windows.get(n, ())
            span = f" ({min(got):.2f}-{max(got):.2f} over {len(got)} windows)" if got else ""
            return f"{'whole budget' if n == WHOLE else f'budget/{n}'} {rates[n]:.2f}{span}"

        cells = ", ".join(cell(n) for n in sorted(rates))
        bound = (
            "memory-bound" if self.memory_bound else "NOT memory-bound: the whole budget serves no more than a share"
        )
        return f"calibration (req/s, median): {cells}; {bound}"


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


def interleaved(measure: Callable[[int, int], float], keys: list[int], rounds: int) -> dict[int, tuple[float, ...]]:
    """``measure(key, round)`` for every key, ``rounds`` times: keys in order on even rounds, reversed
    on odd ones, so that a machine whose speed drifts linearly over the calibration biases no key."""
    seen: dict[int, list[float]] = {k: [] for k in keys}
    for r in range(rounds):
        for k in keys if r % 2 == 0 else keys[::-1]:
            seen[k].append(measure(k, r))
    return {k: tuple(v) for k, v in seen.items()}


def calibrate(setup: Setup, n_models: tuple[int, ...], shape: Shape, tmp: Path, seconds: float = WINDOW_S,
              rounds: int = ROUNDS) -> Capacity:  # fmt: skip
    """One engine on core 0 (the other cores idle): with the whole budget and with the static
    share of each group size in ``n_models`` (a workload's rates follow its own share), every
    measure ``rounds`` windows, interleaved (``interleaved``); the medians are the rates."""
    servers = start_servers(setup, Config("static", False), ("a",), tmp)  # one model: limit = budget
    proc, ep, url = servers["a"]
    try:
        block_bytes = int(httpx.get(ep.url + "/kvpool", timeout=30).json()["block_bytes"])
        tokens = sum(shape.prompt_tokens) / 2 + sum(shape.max_tokens) / 2
        request_bytes = math.ceil(tokens / BLOCK_TOKENS) * block_bytes
        clients = max(4, 2 * setup.budget // request_bytes)
        asyncio.run(closed_loop(url, "a", shape, clients, WARM_S, seed=1))  # warm-up

        def window(n: int, r: int) -> float:
            asyncio.run(_set_limit(ep.url, setup.budget // n))  # the admin port
            return asyncio.run(closed_loop(url, "a", shape, clients, seconds, seed=1000 * (r + 1) + n))

        windows = interleaved(window, [WHOLE, *sorted(set(n_models) - {WHOLE})], rounds)
    finally:
        proc.terminate()
        proc.wait(timeout=120)
    return capacity_of(windows, n_models, request_bytes, clients)


def capacity_of(windows: dict[int, tuple[float, ...]], n_models: tuple[int, ...], request_bytes: int,
                clients: int) -> Capacity:  # fmt: skip
    """Each measure's median is its rate; a one-model workload's share is the whole budget."""
    rate = {n: statistics.median(w) for n, w in windows.items()}
    return Capacity({n: rate[n] for n in n_models}, rate[WHOLE], request_bytes, clients, windows)


DRIFT = 0.2  #: a machine whose speed moved more than this within a workload is flagged in the report


def remeasure(setup: Setup, cap: Capacity, shape: Shape, tmp: Path, seconds: float = WINDOW_S) -> float:
    """The whole budget's rate again (after a workload): its calibration holds only while the
    machine keeps its speed, and a VM's can move by half within an hour. One window of the
    calibration's length after its warm-up (with 28 clients a request takes seconds under load,
    and a window of 10 s after a 3-s warm-up read 0 req/s in a quick run); one window moves a
    tenth from the next on a steady machine (the module docstring), hence a flag at ``DRIFT``."""
    servers = start_servers(setup, Config("static", False), ("a",), tmp)
    proc, _, url = servers["a"]
    try:
        asyncio.run(closed_loop(url, "a", shape, cap.clients, WARM_S, seed=1))  # warm-up
        return asyncio.run(closed_loop(url, "a", shape, cap.clients, seconds, seed=2))
    finally:
        proc.terminate()
        proc.wait(timeout=120)


def drift_line(caps: dict[str, Capacity], after: dict[str, float]) -> str:
    """One line for the report: the machine's speed after each workload against that workload's
    own calibration (taken just before it)."""
    moves = {w: rps / caps[w].full_rps - 1 for w, rps in after.items()}
    cells = ", ".join(f"{w} {caps[w].full_rps:.2f} -> {after[w]:.2f} ({m:+.0%})" for w, m in moves.items())
    flagged = [w for w, m in moves.items() if abs(m) > DRIFT]
    verdict = (f"MOVED more than {DRIFT:.0%} within {', '.join(flagged)}: its rates no longer fit the machine"
               if flagged else f"steady within {DRIFT:.0%}")  # fmt: skip
    return f"machine speed (req/s, whole budget), calibration -> after the workload: {cells} -- {verdict}"


SATURATED = 0.85  #: a peak above this fraction of the whole budget's rate leaves the cores no headroom


def saturation_line(peaks: dict[str, float], after: dict[str, float]) -> str:
    """One line for the report: each workload's peak rate against what the whole budget served
    after it. The busy model never holds the whole budget (the idle ones keep their working
    sets), so a peak near the whole budget's rate is compute-bound under every configuration:
    static's p99 -- every ratio's denominator -- then measures the cores' backlog, not memory
    (stop 38's stopped run: static p99 7.8 s against 2.7 s in the run of record)."""
    shares = {w: peaks[w] / rps for w, rps in after.items()}
    cells = ", ".join(f"{w} {peaks[w]:.2f} of {after[w]:.2f} ({s:.0%})" for w, s in shares.items())
    flagged = [w for w, s in shares.items() if s > SATURATED]
    verdict = (f"SATURATED in {', '.join(flagged)}: memory cannot decide a run whose cores are full"
               if flagged else f"within {SATURATED:.0%}: memory, not the cores, decides")  # fmt: skip
    return f"peak load (req/s) against the whole budget's rate after the workload: {cells} -- {verdict}"
