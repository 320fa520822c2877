"""The colocation benchmark's configurations: how the models share one KV budget.

* ``static``: each model gets budget / N, fixed (the usual per-model memory split).
* ``free``:  free-for-all, as kvcached shares a GPU: every pool may grow to the whole budget,
  the node ledger (``kvpool.ledger``) refuses any map that would overdraw it -- on a GPU the
  device runs out; here the ledger is that device -- and idle pages are released every round
  (kvcached unmaps pages as their blocks free), so memory goes to whoever maps first.
* ``proportional``: the operator's previous policy (``spec.rebalance.policy: proportional``).
* ``demand``: the operator's new policy (``kvpool_operator.demand``, the default).
* ``demand-drain`` (only when asked for): ``demand`` with the servers' ``--preempt-after-s null``
  -- a shrink waits for the donor's running requests to finish instead of preempting them; the
  side-by-side measure of preemption on shrink.
* ``demand@10:30`` (only when asked for; either policy, drained or not): the operator's round every
  10 s with a 30-s dwell instead of the run's ``--interval`` and ``--dwell`` -- the side-by-side
  measure of the round's cadence (the policy counts in rounds: a grant waits ``PERSIST`` of them).

Both policies run the operator's own round code (``kvpool_operator.balance.Balancer``, shrinks
first, grants within headroom) over the admin API, without Kubernetes. Each configuration runs
with the CPU tier off and on (``+tier``), so the tier's share is reported apart.

On the CPU every engine is pinned to its own core (``taskset`` + ``VLLM_CPU_OMP_THREADS_BIND``);
with more models than cores, the first (busiest) keeps core 0 and the others share the rest.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, NamedTuple

import httpx
from kvpool_operator.balance import Balancer, PodRound
from kvpool_operator.pools import AdminClient, Endpoint
from kvpool_operator.spec import GroupSpec, parse_group

from bench.servers import check_serves, distinct_ports, start

POLICIES = ("static", "free", "proportional", "demand")
DRAIN = "-drain"  #: a policy's variant whose shrinks never preempt (not in the default run)
CADENCE = "@"  #: an operated policy's variant at its own interval and dwell: "demand@10:30"
VARIANTS = ("demand" + DRAIN, "demand" + CADENCE + "10:30")  #: examples, for --help
OPERATED = ("proportional", "demand")  #: the policies the operator's round runs


@dataclass(frozen=True)
class Config:
    policy: str  #: one of POLICIES
    tier: bool
    preempt: bool = True  #: shrinks preempt after the servers' default --preempt-after-s
    #: the operator's round (interval s, dwell s) where not the run's (``--interval``, ``--dwell``)
    cadence: tuple[float, float] | None = None

    @property
    def name(self) -> str:
        at = "" if self.cadence is None else f"{CADENCE}{self.cadence[0]:g}:{self.cadence[1]:g}"
        return self.policy + ("" if self.preempt else DRAIN) + at + ("+tier" if self.tier else "")


def variant(text: str) -> Config:
    """A ``--policies`` entry as its configuration (tier off): a policy of ``POLICIES``, or an
    operated one with ``-drain`` and/or ``@INTERVAL:DWELL`` (seconds). ValueError says what to fix."""
    head, at, cadence = text.partition(CADENCE)
    policy = head.removesuffix(DRAIN)
    variant_of = OPERATED if head != policy or at else POLICIES
    if policy not in variant_of:
        raise ValueError(f"{text!r}: {policy!r} is not among {list(variant_of)}")
    if not at:
        return Config(policy, False, head == policy)
    try:
        interval, dwell = (float(x) for x in cadence.split(":"))
    except ValueError:
        raise ValueError(f"{text!r}: after {CADENCE!r} give INTERVAL:DWELL in seconds, e.g. {policy}@10:30") from None
    if not (interval >= 1 and dwell >= 0):  # the CRD's own bounds (``spec.rebalance``)
        raise ValueError(f"{text!r}: the interval must be at least 1 s and the dwell at least 0 s")
    return Config(policy, False, head == policy, (interval, dwell))


def configs(policies: list[str]) -> list[Config]:
    return [replace(variant(p), tier=tier) for tier in (False, True) for p in policies]


@dataclass(frozen=True)
class Setup:
    """What every configuration of one run shares."""

    model: str
    backend: str
    budget: int
    offload_bytes: int
    interval_s: float
    dwell_s: float
    dtype: str = "auto"  #: vLLM's --dtype for every engine ("auto": the model's own)


def core_of(i: int, cores: int | None = None) -> int:
    """The first model (the busiest of every workload) alone on core 0; the others round-robin
    over the rest. With three models on two cores, the two that share peak at different times
    (longtail: b, then c), so a peak never computes beside the other one's."""
    cores = cores or os.cpu_count() or 1
    return 0 if i == 0 or cores == 1 else 1 + (i - 1) % (cores - 1)


class Running(NamedTuple):
    proc: Any
    admin: Endpoint  # the admin port, as the operator finds it
    url: str  # the OpenAI port


def server_cmd(setup: Setup, cfg: Config, name: str, ports: tuple[int, int], n_models: int, tmp: Path) -> list[str]:
    limit = setup.budget if cfg.policy == "free" else setup.budget // n_models
    cmd = [sys.executable, "-m", "kvpool_server", "--model", setup.model, "--served-model-name", name,
           "--port", str(ports[0]), "--admin-port", str(ports[1]), "--backend", setup.backend,
           "--limit-bytes", str(limit),
           "--virtual-bytes", str(setup.budget), "--max-model-len", "2048"]  # fmt: skip
    if cfg.policy == "free":
        cmd += ["--ledger-bytes", str(setup.budget), "--ledger-path", str(tmp / "ledger")]
    if not cfg.preempt:
        cmd += ["--preempt-after-s", "null"]
    if cfg.tier:
        cmd += ["--offload-bytes", str(setup.offload_bytes), "--offload-dir", str(tmp)]
    if setup.dtype != "auto":
        cmd += ["--vllm-args", f"--dtype {setup.dtype}"]
    return cmd


def start_servers(setup: Setup, cfg: Config, models: tuple[str, ...], tmp: Path) -> dict[str, Running]:
    """Start every model's server at once, each pinned to its core, on ports chosen together
    (``distinct_ports``); wait until all answer, each serving its own model (``check_serves``)."""
    import concurrent.futures

    ports = distinct_ports(2 * len(models))

    def one(i: int, name: str) -> Running:
        port, admin_port, core = ports[2 * i], ports[2 * i + 1], core_of(i)
        cmd = server_cmd(setup, cfg, name, (port, admin_port), len(models), tmp)
        env = {}
        if setup.backend == "host":  # on a GPU the device computes: no core of its own needed
            cmd, env = ["taskset", "-c", str(core), *cmd], {"VLLM_CPU_OMP_THREADS_BIND": str(core)}
        proc = start(cmd, port, tmp / f"{name}-{cfg.name}.log", env)
        try:
            check_serves(f"http://127.0.0.1:{port}", name)
        except Exception:
            proc.kill()  # a server whose port another holds must not outlive the failed start
            raise
        return Running(proc, Endpoint("127.0.0.1", name, admin_port), f"http://127.0.0.1:{port}")

    with concurrent.futures.ThreadPoolExecutor(len(models)) as ex:
        futures = {name: ex.submit(one, i, name) for i, name in enumerate(models)}
        return {name: f.result() for name, f in futures.items()}


def group_spec(setup: Setup, cfg: Config, models: tuple[str, ...]) -> GroupSpec:
    n = len(models)
    interval, dwell = cfg.cadence or (setup.interval_s, setup.dwell_s)
    return parse_group({
        "gpuMemoryBudgetBytes": setup.budget,
        "rebalance": {"intervalSeconds": interval, "hysteresisBytes": setup.budget // 32,
                      "maxStepBytes": setup.budget // 2, "policy": cfg.policy, "minDwellSeconds": dwell},
        "models": [{"name": m, "model": setup.model, "minBytes": setup.budget // (3 * n),
                    "maxBytes": setup.budget - (n - 1) * setup.budget // (3 * n)} for m in models],
    })  # fmt: skip


async def balance(group: GroupSpec, eps: dict[str, Endpoint], stop: asyncio.Event, t0: float,
                  log: list[dict[str, Any]]) -> None:  # fmt: skip
    """The operator's round, every interval, as the kopf timer runs it (memory carried over)."""
    client = AdminClient()
    balancer = Balancer(client, wait_s=group.interval_s)
    known: dict[str, int] = {}
    preempt: dict[str, int] = {}
    memory = None
    try:
        while not stop.is_set():
            started = time.monotonic()
            r = await asyncio.to_thread(balancer.round, group, "127.0.0.1", eps, known, preempt, memory)
            known = {n: s.limit_bytes for n, s in r.snapshots.items()}
            preempt = {**preempt, **r.preemption_marks}
            memory = r.memory
            log.append({"t": started - t0, "seconds": time.monotonic() - started, "problems": r.problems,
                        "resizes": [z.__dict__ for z in r.resizes], "seen": seen(r)})  # fmt: skip
            await asyncio.sleep(max(0.0, group.interval_s - (time.monotonic() - started)))
    finally:
        client.close()


def seen(r: PodRound) -> dict[str, dict[str, Any]]:
    """What the round read of each pool and what the demand policy made of it: the traces a stall
    is read from afterwards (a ``used_bytes`` / ``running`` reading that inflated a donor's
    "largest request" is visible only here)."""
    out: dict[str, dict[str, Any]] = {}
    for name, obs in r.observed.items():
        mem = r.memory.models.get(name)
        out[name] = {"limit": obs.limit_bytes, "used": obs.used_bytes, "running": obs.running_requests,
                     "waiting": obs.waiting_requests, "preemptions": obs.preemptions,
                     "finished": obs.finished_total}  # fmt: skip
        if mem is not None:
            out[name] |= {"per_request": round(mem.per_request), "largest": round(mem.largest_request),
                          "quiet": mem.quiet, "slack": mem.slack, "surge": mem.surge,
                          "short": mem.short_rounds}  # fmt: skip
    return out


async def release_idle(eps: dict[str, Endpoint], interval_s: float, stop: asyncio.Event) -> None:
    """Free-for-all: every pool gives its idle pages back each round (POST /kvpool/trim)."""
    async with httpx.AsyncClient(timeout=30) as client:
        while not stop.is_set():
            for ep in eps.values():
                with contextlib.suppress(httpx.HTTPError):  # a busy engine answers late: next round
                    await client.post(ep.url + "/kvpool/trim")
            await asyncio.sleep(interval_s)


def controller(setup: Setup, cfg: Config, eps: dict[str, Endpoint], stop: asyncio.Event, t0: float,
               log: list[dict[str, Any]]) -> asyncio.Task[None] | None:  # fmt: skip
    if cfg.policy == "free":
        return asyncio.create_task(release_idle(eps, setup.interval_s, stop))
    if cfg.policy in OPERATED:
        return asyncio.create_task(balance(group_spec(setup, cfg, tuple(eps)), eps, stop, t0, log))
    return None
