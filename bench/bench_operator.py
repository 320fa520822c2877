"""Operator reaction time: from a load step on one model to its grown limit applied and in use.

Two real kvpool-servers (tiny model, CPU) share a 256 MiB budget, 128 MiB each. The operator's own
round code (``kvpool_operator.balance.Balancer`` with the group's pure policy, the same calls the
kopf timer makes each interval) runs every ``--interval`` seconds; a burst of long prompts hits
model ``a``. Printed: seconds until ``a``'s grown limit is applied, seconds until its mapped memory
exceeds the old limit, and how many rounds that took. (The Kubernetes round trip -- EndpointSlice
discovery and the status patch -- is measured end to end in tests/operator/test_handlers.py.)
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx
from kvpool_operator.balance import Balancer
from kvpool_operator.pools import AdminClient, Endpoint
from kvpool_operator.spec import GroupSpec, parse_group

from bench.common import write_result
from bench.servers import free_port, start

MiB = 1 << 20
START = 128 * MiB  # each pool's limit before the load step


def burst(url: str, stop: threading.Event, streams: int) -> None:
    def one(i: int) -> None:
        body = {"model": "a", "prompt": [list(range(10 + i, 1700 + i))], "max_tokens": 64, "ignore_eos": True}
        while not stop.is_set():
            httpx.post(url + "/v1/completions", timeout=300, json=body)

    threads = [threading.Thread(target=one, args=(i,), daemon=True) for i in range(streams)]
    for t in threads:
        t.start()
    stop.wait()
    for t in threads:
        t.join(timeout=300)


def react(group: GroupSpec, eps: dict[str, Endpoint], interval: float, streams: int) -> tuple[Any, Any, int]:
    """Load step on ``a`` at t=0; rounds every ``interval``; poll ``a``'s pool in between.
    Returns (limit applied s, grown memory in use s, rounds)."""
    client = AdminClient()
    balancer = Balancer(client, wait_s=interval)
    stop = threading.Event()
    rounds, applied_s, in_use_s, preempt = 0, None, None, {n: 0 for n in eps}
    loader = threading.Thread(target=burst, args=(eps["a"].url, stop, streams), daemon=True)
    t0 = time.monotonic()
    loader.start()
    try:
        while in_use_s is None and time.monotonic() - t0 < 300:
            r = balancer.round(group, "127.0.0.1", eps, {}, preempt)
            rounds += 1
            preempt = {**preempt, **r.preemption_marks}
            deadline = time.monotonic() + interval
            while time.monotonic() < deadline and in_use_s is None:
                snap = client.snapshot(eps["a"])
                if applied_s is None and snap.limit_bytes > START:
                    applied_s = time.monotonic() - t0
                if snap.mapped_bytes > START:
                    in_use_s = time.monotonic() - t0
                time.sleep(0.05)
    finally:
        stop.set()
        loader.join(timeout=300)
        client.close()
    return applied_s, in_use_s, rounds


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--interval", type=float, default=2.0, help="rebalance interval (s)")
    ap.add_argument("--streams", type=int, default=40)
    args = ap.parse_args(argv)
    from kvpool.vllm.launch.tiny_model import build_tiny_model

    model = str(build_tiny_model(Path(tempfile.gettempdir()) / "kvpool-bench-tiny"))
    group = parse_group({
        "gpuMemoryBudgetBytes": "256Mi", "rebalance": {"hysteresisBytes": "8Mi", "maxStepBytes": "64Mi"},
        "models": [{"name": n, "model": model, "minBytes": "32Mi", "maxBytes": "224Mi"} for n in "ab"],
    })  # fmt: skip
    tmp = Path(tempfile.mkdtemp())
    ports = {n: (free_port(), free_port()) for n in "ab"}  # OpenAI, admin
    procs = [start([sys.executable, "-m", "kvpool_server", "--model", model, "--served-model-name", n, "--port",
                    str(p), "--admin-port", str(a), "--limit-bytes", str(START), "--virtual-bytes", "512Mi"], p,
                   tmp / f"{n}.log")
             for n, (p, a) in ports.items()]  # fmt: skip
    try:
        applied_s, in_use_s, rounds = react(group, {n: Endpoint("127.0.0.1", n, a) for n, (_, a) in ports.items()},
                                            args.interval, args.streams)  # fmt: skip
    finally:
        for proc in procs:
            proc.terminate()
            proc.wait(timeout=60)
    print(f"interval {args.interval:.1f} s: grown limit applied after {applied_s:.2f} s, "
          f"in use after {in_use_s:.2f} s, {rounds} rounds")  # fmt: skip
    write_result("bench_operator", {"args": vars(args), "limit_applied_s": applied_s, "in_use_s": in_use_s,
                                    "rounds": rounds})  # fmt: skip


if __name__ == "__main__":
    main()
