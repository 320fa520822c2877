"""Colocation: elastic pools moved by the operator's policy vs a static split, same budget.

Two real kvpool-servers (the tiny local model on the CPU; ``--model``/``--backend cuda`` on a GPU
host) share one KV budget. The same seeded, bursty workload (bench/colocation_workload.py) runs
twice, back to back:

1. static:  each model gets budget / N, fixed (the usual per-model memory split);
2. elastic: the pools start at the same split and are resized live by the operator's own round
            code -- ``kvpool_operator.balance.Balancer`` (the pure policy, shrinks first, grants
            within headroom) over the admin API, without Kubernetes -- with the CPU tier on.

Output: results/bench_colocation.json, a Markdown table with elastic / static ratios, and PNGs
(memory per model over time with the load overlay; TTFT CDF static vs elastic).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
from kvpool_operator.balance import Balancer
from kvpool_operator.pools import AdminClient, Endpoint
from kvpool_operator.spec import GroupSpec, parse_group

from bench.colocation_report import report
from bench.colocation_workload import WorkloadSpec, drive, schedule
from bench.common import RESULTS
from bench.servers import free_port, start

MiB = 1 << 20
CONTROLLER = "kvpool_operator.balance.Balancer (the operator's policy + admin API; no Kubernetes)"


def start_servers(args: argparse.Namespace, elastic: bool, tmp: Path) -> dict[str, tuple[Any, Endpoint]]:
    out = {}
    for name in ("a", "b"):
        port = free_port()
        cmd = [sys.executable, "-m", "kvpool_server", "--model", args.model, "--served-model-name", name,
               "--port", str(port), "--backend", args.backend, "--limit-bytes", str(args.budget // 2),
               "--virtual-bytes", str(args.budget), "--max-model-len", "2048"]  # fmt: skip
        if elastic and args.offload_bytes:
            cmd += ["--offload-bytes", str(args.offload_bytes), "--offload-dir", str(tmp)]
        out[name] = (start(cmd, port, tmp / f"{name}-{'elastic' if elastic else 'static'}.log"),
                     Endpoint("127.0.0.1", name, port))  # fmt: skip
    return out


async def sample(eps: dict[str, Endpoint], stop: asyncio.Event, t0: float, out: list[dict[str, Any]]) -> None:
    async with httpx.AsyncClient(timeout=30) as client:
        while not stop.is_set():
            row: dict[str, Any] = {"t": time.monotonic() - t0}
            for name, ep in eps.items():
                try:
                    s = (await client.get(ep.url + "/kvpool")).json()
                except httpx.HTTPError:
                    continue  # a busy engine answers late: this sample goes without the model
                d = s["demand"]
                row[name] = {"limit": s["limit_bytes"], "mapped": s["mapped_bytes"],
                             "running": d["running_requests"], "waiting": d["waiting_requests"]}  # fmt: skip
            if len(row) == len(eps) + 1:
                out.append(row)
            await asyncio.sleep(0.25)


async def control(group: GroupSpec, eps: dict[str, Endpoint], stop: asyncio.Event, t0: float,
                  log: list[dict[str, Any]]) -> None:  # fmt: skip
    client = AdminClient()
    balancer = Balancer(client, wait_s=group.interval_s)
    known: dict[str, int] = {}
    preempt: dict[str, int] = {}
    try:
        while not stop.is_set():
            started = time.monotonic()
            r = await asyncio.to_thread(balancer.round, group, "127.0.0.1", eps, known, preempt)
            known = {n: s.limit_bytes for n, s in r.snapshots.items()}
            preempt = {n: s.preemptions for n, s in r.snapshots.items()}
            log.append({"t": started - t0, "seconds": time.monotonic() - started, "problems": r.problems,
                        "resizes": [z.__dict__ for z in r.resizes]})  # fmt: skip
            await asyncio.sleep(max(0.0, group.interval_s - (time.monotonic() - started)))
    finally:
        client.close()


async def run_config(args: argparse.Namespace, group: GroupSpec | None, eps: dict[str, Endpoint]) -> dict[str, Any]:
    requests = schedule(WorkloadSpec(
        seed=args.seed, phases=args.phases, phase_s=args.phase_s, heavy_rate=args.heavy_rate,
        light_rate=args.light_rate, prompt_tokens=tuple(args.prompt_tokens), max_tokens=tuple(args.max_tokens),
        shared_prefix=min(768, args.prompt_tokens[0] // 2),
    ))  # fmt: skip
    stop = asyncio.Event()
    samples: list[dict[str, Any]] = []
    rounds: list[dict[str, Any]] = []
    t0 = time.monotonic()
    tasks = [asyncio.create_task(sample(eps, stop, t0, samples))]
    if group is not None:
        tasks.append(asyncio.create_task(control(group, eps, stop, t0, rounds)))
    outcomes = await drive({n: ep.url for n, ep in eps.items()}, requests, t0)
    stop.set()
    await asyncio.gather(*tasks)
    async with httpx.AsyncClient(timeout=10) as client:
        final = {n: (await client.get(ep.url + "/kvpool")).json() for n, ep in eps.items()}
    return {"outcomes": [o.__dict__ for o in outcomes], "samples": samples, "rounds": rounds, "final": final,
            "requests": len(requests), "wall_s": time.monotonic() - t0}  # fmt: skip


def run(args: argparse.Namespace, elastic: bool, tmp: Path) -> dict[str, Any]:
    servers = start_servers(args, elastic, tmp)
    eps = {n: ep for n, (_, ep) in servers.items()}
    group = parse_group({
        "gpuMemoryBudgetBytes": args.budget,
        "rebalance": {"intervalSeconds": args.interval, "hysteresisBytes": args.budget // 8,
                      "maxStepBytes": args.budget // 4},
        "models": [{"name": n, "model": args.model, "minBytes": args.budget // 8, "maxBytes": args.budget * 7 // 8}
                   for n in eps],
    }) if elastic else None  # fmt: skip
    try:
        return asyncio.run(run_config(args, group, eps))
    finally:
        for proc, _ in servers.values():
            proc.terminate()
            proc.wait(timeout=120)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="", help="model path (default: the embedded tiny model)")
    ap.add_argument("--backend", choices=["host", "cuda"], default="host")
    ap.add_argument("--budget", type=int, default=16 * MiB, help="KV bytes both models share")
    ap.add_argument("--offload-bytes", type=int, default=32 * MiB, help="CPU tier per model (elastic run)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--phases", type=int, default=4)
    ap.add_argument("--phase-s", type=float, default=12.0)
    ap.add_argument("--heavy-rate", type=float, default=5.0, help="requests/s to the busy model")
    ap.add_argument("--light-rate", type=float, default=0.5)
    ap.add_argument("--prompt-tokens", type=int, nargs=2, default=[600, 1000], help="prompt length range")
    ap.add_argument("--max-tokens", type=int, nargs=2, default=[32, 64], help="output length range")
    ap.add_argument("--interval", type=float, default=1.0, help="rebalance interval (s)")
    args = ap.parse_args(argv)
    if not args.model:
        from kvpool.vllm.launch.tiny_model import build_tiny_model

        args.model = str(build_tiny_model(Path(tempfile.gettempdir()) / "kvpool-bench-tiny"))
    with tempfile.TemporaryDirectory(dir="/dev/shm") as d:
        results = {"static": run(args, False, Path(d)), "elastic": run(args, True, Path(d))}
    report(results, {**vars(args), "controller": CONTROLLER}, RESULTS)


if __name__ == "__main__":
    main()
