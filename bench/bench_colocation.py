"""Colocation: models sharing one KV budget under a static split, a free-for-all, the operator's
previous (proportional) policy and its new (demand) policy -- each with the CPU tier off and on
-- on three seeded workloads (bench/colocation_workload.py), in one run.

Real kvpool-servers (the tiny local model on the CPU; ``--model``/``--backend cuda`` on a GPU
host), each pinned to its own core. A calibration (bench/colocation_calibrate.py) measures
what one engine serves with its share of the budget and with all of it (each the median of four
interleaved 20-s windows: one window moves a tenth from the next here); every workload's rates
are set from those, so the busy model asks for more than its share serves and less than its core
computes; each workload is calibrated just before it runs (the machine's speed drifts over tens of
minutes). Each workload runs with ``--repeats`` seeds (2), every configuration on each; the
tables pool a configuration's repeats (percentiles over all their requests) and show the repeats'
own p99 ratios to static beside, lowest to highest. Configurations alternate their order from
one repeat (and workload) to the next. After each
workload the whole budget's rate is measured again: a machine whose speed moved more than 20%
from that workload's calibration is flagged in the report (its rates no longer fit it).

Output: one table per workload with every configuration side by side and ratios to static (the
same tier setting), per model and overall; compute saturation (CPU utilisation of each engine,
the deepest queue) beside it; results/bench_colocation.json and PNGs (memory per model over time;
TTFT CDF per configuration); every server's log in results/colocation-logs/.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import psutil
from kvpool_operator.pools import Endpoint
from kvpool_operator.spec import DWELL_ROUNDS, INTERVAL_S

from bench.colocation_calibrate import Capacity, calibrate, drift_line, remeasure, saturation_line
from bench.colocation_configs import (
    POLICIES,
    VARIANTS,
    Config,
    Running,
    Setup,
    configs,
    controller,
    start_servers,
    variant,
)
from bench.colocation_report import report
from bench.colocation_workload import WORKLOADS, Shape, Workload, bursts, drive, longtail, schedule, steady
from bench.common import RESULTS

PARTIAL = RESULTS / "colocation-partial"  #: a subset's results: the full run's files stay the record

MiB = 1 << 20
REPEATS = 2  #: seeds of each workload in the run of record: one run's p99 decided one goal each way in turn
DEADLINE_S = 120.0  #: after the last arrival, what is still unanswered fails


MODELS = {"bursts": 2, "longtail": 3, "steady": 2}  #: models per workload: its static share is budget / N


# The busy model's peak, as a fraction of the way from what its static share serves to what the
# whole budget serves. Not 1: the idle models keep their working sets (2-3 requests each, a sixth
# of the budget with two models), so the busy one never holds the whole budget. At 0.6 (until
# stop 34) its peak was what the memory it *can* get serves (bursts: 8.1 req/s against ~8.3 at
# 13.25 of 16 MiB): an elastic run sat at saturation, its queue never drained (b: 16-18 running,
# 10-20 waiting for a whole phase), and whether a run met the goal turned on a calibration's
# few per cent (0.29x and 0.75x static for the same code three hours apart). At 0.4 the busy
# model loads that memory to ~0.9 and overloads its static share by ~1.2x: memory decides. At
# 16 MiB the whole budget served only ~1.45x half of it, so that 1.2x overload sat within the
# run-to-run swing of the engines' own speed (one 20-s window moves ~10% from the next) and runs
# of record flipped between memory-bound and saturated. Stop 39: at 8 MiB (and the tokens
# streamed 16 at a time, ``STREAM_INTERVAL``) the whole budget serves ~1.7x its half, and at
# 0.45 the peak overloads static's share by ~1.3x while asking for ~0.77x of the whole budget.
PEAK = 0.45


def workloads(names: list[str], cap: Capacity, phase_s: float, peak: float = PEAK) -> list[Workload]:
    """Rates as multiples of what a model's static share (budget / the workload's N) serves
    (``unit``): the busy model's peak ``peak`` of the way from that to what the whole budget
    serves, the idle ones at a tenth, the steady load at 0.6x."""

    def hot(n: int) -> float:
        return 1 + peak * (cap.full_rps / cap.share_rps(n) - 1)

    made = {"bursts": lambda: bursts(cap.share_rps(2), hot(2), 0.1, phase_s),
            "longtail": lambda: longtail(cap.share_rps(3), hot(3), 0.1, phase_s),
            "steady": lambda: steady(cap.share_rps(2), 0.6, 3 * phase_s)}  # fmt: skip
    return [made[n]() for n in names]


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
                row[name] = {"limit": s["limit_bytes"], "mapped": s["mapped_bytes"], "physical": s["physical_bytes"],
                             "running": d["running_requests"], "waiting": d["waiting_requests"]}  # fmt: skip
            if len(row) == len(eps) + 1:
                out.append(row)
            await asyncio.sleep(0.25)


def cpu_seconds(pid: int) -> float:
    """CPU time of a server and all its processes (API server, engine core)."""
    try:
        procs = [psutil.Process(pid), *psutil.Process(pid).children(recursive=True)]
    except psutil.NoSuchProcess:
        return 0.0
    total = 0.0
    for p in procs:
        try:
            t = p.cpu_times()
            total += t.user + t.system
        except psutil.NoSuchProcess:
            pass
    return total


async def run_config(setup: Setup, cfg: Config, work: Workload, seed: int, shape: Shape,
                     servers: dict[str, Running]) -> dict[str, Any]:  # fmt: skip
    eps = {n: r.admin for n, r in servers.items()}
    requests = schedule(work, shape, seed)
    stop = asyncio.Event()
    samples: list[dict[str, Any]] = []
    rounds: list[dict[str, Any]] = []
    cpu0 = {n: cpu_seconds(r.proc.pid) for n, r in servers.items()}
    t0 = time.monotonic()
    tasks = [asyncio.create_task(sample(eps, stop, t0, samples))]
    ctl = controller(setup, cfg, eps, stop, t0, rounds)
    tasks += [ctl] if ctl else []
    outcomes = await drive({n: r.url for n, r in servers.items()}, requests, t0, work.duration_s + DEADLINE_S)
    wall = time.monotonic() - t0
    stop.set()
    await asyncio.gather(*tasks)
    util = {n: (cpu_seconds(r.proc.pid) - cpu0[n]) / wall for n, r in servers.items()}
    async with httpx.AsyncClient(timeout=30) as client:
        final = {n: (await client.get(ep.url + "/kvpool")).json() for n, ep in eps.items()}
        integrity = {n: (await client.get(ep.url + "/kvpool/integrity")).status_code == 200 for n, ep in eps.items()}
    return {"outcomes": [o.__dict__ for o in outcomes], "samples": samples, "rounds": rounds, "final": final,
            "requests": len(requests), "wall_s": wall, "duration_s": work.duration_s, "cpu_utilisation": util,
            "integrity_ok": integrity}  # fmt: skip


def run(setup: Setup, cfg: Config, work: Workload, seed: int, shape: Shape, tmp: Path) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(dir=tmp) as d:
        servers = start_servers(setup, cfg, work.models, Path(d))
        try:
            return asyncio.run(run_config(setup, cfg, work, seed, shape, servers))
        finally:
            for r in servers.values():
                r.proc.terminate()
            for r in servers.values():
                r.proc.wait(timeout=120)
            # every server's log, for a run that went wrong
            logs = RESULTS / "colocation-logs" / f"{work.name}-seed{seed}"
            logs.mkdir(parents=True, exist_ok=True)
            for log in Path(d).glob("*.log"):
                shutil.copy(log, logs / log.name)


def alternate(cfgs: list[Config], turn: int) -> list[Config]:
    """The configurations in their order on even turns (repeats, counted across workloads), reversed
    on odd ones: a machine that speeds up or slows down within a workload favours none."""
    return cfgs if turn % 2 == 0 else cfgs[::-1]


def parse(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="", help="model path (default: the embedded tiny model)")
    ap.add_argument("--backend", choices=["host", "cuda"], default="host")
    ap.add_argument(
        "--budget",
        type=int,
        default=8 * MiB,
        help="KV bytes the models share (8 MiB: seven requests of the workloads' shape in float32; with half "
        "of it an engine serves ~1.7x less, so memory binds well before the cores do)",
    )
    ap.add_argument("--offload-bytes", type=int, default=32 * MiB, help="CPU tier per model (+tier configurations)")
    ap.add_argument(
        "--dtype",
        choices=["auto", "float32", "bfloat16"],
        default=None,
        help="the engines' dtype (default: float32 with --backend host, else auto -- the model's own "
        "bfloat16 runs 2x slower in batches on a CPU without AVX-512, and its engines were "
        "compute-bound before memory could bind)",
    )
    ap.add_argument("--seed", type=int, default=0, help="the first repeat's seed; repeat k runs seed + k")
    ap.add_argument(
        "--repeats",
        type=int,
        default=REPEATS,
        help="seeds of every workload (each configuration runs each; ratios pooled, spread shown)",
    )
    ap.add_argument("--phase-s", type=float, default=12.0, help="length of one phase of a workload")
    ap.add_argument("--peak", type=float, default=PEAK,
                    help="the busy model's peak: this fraction of the way from what its static share serves to "
                         "what the whole budget serves (0 < peak < 1)")  # fmt: skip
    ap.add_argument("--interval", type=float, default=float(INTERVAL_S),
                    help="rebalance interval (s; default: the CRD's, intervalSeconds)")  # fmt: skip
    ap.add_argument("--dwell", type=float, default=float(INTERVAL_S * DWELL_ROUNDS),
                    help="demand policy: minimum dwell (s; default: the CRD's, minDwellSeconds)")  # fmt: skip
    ap.add_argument("--workloads", default=",".join(WORKLOADS), help=f"comma-separated, of {', '.join(WORKLOADS)}")
    ap.add_argument(
        "--policies",
        default=",".join(POLICIES),
        help=f"comma-separated, of {', '.join(POLICIES)}, or variants of an operated one such as "
        f"{', '.join(VARIANTS)} (servers that never preempt; the round every 10 s, a 30-s dwell)",
    )
    ap.add_argument("--tier", choices=["both", "off", "on"], default="both", help="CPU tier in the configurations")
    ap.add_argument("--out", type=Path, default=None,
                    help=f"JSON and PNGs (default: {RESULTS}/ for the full run, {PARTIAL}/ for a subset: "
                         "a subset never replaces the run of record)")  # fmt: skip
    args = ap.parse_args(argv)
    if args.repeats < 1:
        ap.error(f"--repeats: {args.repeats} must be at least 1")
    if not 0 < args.peak < 1:
        ap.error(f"--peak: {args.peak} must be between 0 and 1 (exclusive)")
    if bad := [x for x in args.workloads.split(",") if x not in WORKLOADS]:
        ap.error(f"--workloads: {bad} not among {list(WORKLOADS)}")
    for text in args.policies.split(","):
        try:
            variant(text)
        except ValueError as e:
            ap.error(f"--policies: {e}")
    full = (args.workloads, args.policies, args.tier, args.repeats, args.peak) == (
        ",".join(WORKLOADS),
        ",".join(POLICIES),
        "both",
        REPEATS,
        PEAK,
    )
    args.out = args.out or (RESULTS if full else PARTIAL)
    args.dtype = args.dtype or ("float32" if args.backend == "host" else "auto")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse(argv)
    policies, names = args.policies.split(","), args.workloads.split(",")
    if not args.model:
        from kvpool.vllm.launch.tiny_model import build_tiny_model

        args.model = str(build_tiny_model(Path(tempfile.gettempdir()) / "kvpool-bench-tiny"))
    setup = Setup(args.model, args.backend, args.budget, args.offload_bytes, args.interval, args.dwell, args.dtype)
    cfgs = [c for c in configs(policies) if args.tier == "both" or c.tier == (args.tier == "on")]
    shape = Shape()
    results: dict[str, dict[str, list[dict[str, Any]]]] = {}
    caps: dict[str, Capacity] = {}  #: each workload's own calibration, taken just before it
    speed: dict[str, float] = {}  #: the machine's rate with the whole budget after each workload
    peaks: dict[str, float] = {}  #: each workload's busy model's peak rate
    with tempfile.TemporaryDirectory(dir="/dev/shm") as d:
        for i, name in enumerate(names):
            # Calibrated just before its workload, not once for the run: the machine's speed drifts
            # over tens of minutes (10.7 req/s at stop 38's calibration, 9.45 after bursts, 25 min
            # later), and rates an hour old loaded steady against another machine than measured.
            caps[name] = cap = calibrate(setup, (MODELS[name],), shape, Path(d))
            print(f"{name}: {cap.line()}", flush=True)
            work = workloads([name], cap, args.phase_s, args.peak)[0]
            peaks[name] = work.peak_rps
            results[name] = {c.name: [] for c in cfgs}
            for k in range(args.repeats):
                for cfg in alternate(cfgs, i * args.repeats + k):
                    print(f"== {name} (seed {args.seed + k}): {cfg.name}", flush=True)
                    results[name][cfg.name].append(run(setup, cfg, work, args.seed + k, shape, Path(d)))
            speed[name] = remeasure(setup, cap, shape, Path(d))
            # every workload's results as they come: a run cut short keeps the workloads it finished
            meta = {**vars(args), "out": str(args.out), "capacity": {w: c.__dict__ for w, c in caps.items()},
                    "calibration": "\n".join(f"{w}: {c.line()}" for w, c in caps.items()),
                    "speed_after": speed, "drift": drift_line(caps, speed),
                    "saturation": saturation_line(peaks, speed)}  # fmt: skip
            report(results, meta, args.out)


if __name__ == "__main__":
    main()
