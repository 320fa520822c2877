"""The kopf handlers: run each ColocatedModels group and keep moving memory between its models.

* create / update (spec) / resume: parse the spec (a bad one is a ``PermanentError`` naming the
  field), build the manifests (:mod:`kvpool_operator.builders`) and server-side-apply them;
  idempotent, so a restarted operator converges to the same objects.
* a timer: every ``spec.rebalance.intervalSeconds``, start to start (``due``; the last round's
  start lives in the status, so restarts neither skip nor double rounds), find each pod's servers
  through the per-model Services' EndpointSlices and run a :class:`~kvpool_operator.balance.Balancer`
  round per pod; write per-model status and the Ready / Balanced / Degraded conditions; post an
  Event for every resize and every failure the round before did not post.
"""

from __future__ import annotations

import base64
import dataclasses
import datetime as dt
import logging
import os
import time
from collections import defaultdict
from collections.abc import Mapping
from typing import Any

import kopf
from kubernetes import client as k8s
from kubernetes import config as k8s_config
from kubernetes.dynamic import DynamicClient
from kubernetes.dynamic.exceptions import ResourceNotFoundError

from kvpool_operator import metrics
from kvpool_operator.balance import Balancer, PodRound
from kvpool_operator.builders import manifests
from kvpool_operator.crd import GROUP, PLURAL, VERSION
from kvpool_operator.pools import AdminClient, Endpoint, endpoints_from_slices, slice_selector
from kvpool_operator.spec import GroupSpec, SpecError, parse_group
from kvpool_operator.status import conditions, degraded, model_status, now

log = logging.getLogger(__name__)
FIELD_MANAGER = "kvpool-operator"


@kopf.on.startup()
def configure(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
    settings.persistence.progress_storage = kopf.StatusProgressStorage(field="status.kopf")
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(prefix=GROUP)
    settings.peering.name, settings.peering.mandatory, settings.peering.clusterwide = "kvpool-operator", False, True
    # without these a watch can hang silently on a half-dead connection (kopf #698, #204): the API
    # server ends each watch within 2 min, the client gives up a little later, requests after 30 s
    settings.watching.server_timeout = 120
    settings.watching.client_timeout = 150
    settings.watching.connect_timeout = 30
    settings.networking.request_timeout = 30
    try:
        k8s_config.load_incluster_config()
    except k8s_config.ConfigException:
        k8s_config.load_kube_config(config_file=os.environ.get("KUBECONFIG"))  # read now, not at import
    memo.api = k8s.ApiClient()
    memo.totals = {"rounds": 0}  # each group's memo copies this one, sharing the dict: the probe's count
    logging.getLogger("kopf.objects").addFilter(_QUIET_TICKS)
    memo.dynamic = DynamicClient(memo.api)


def in_cluster_server(env: Mapping[str, str]) -> str | None:
    """The API server's address as client-go's InClusterConfig (and the kubernetes client that
    :func:`startup` loads) finds it: ``KUBERNETES_SERVICE_HOST``/``PORT``, which the kubelet sets in
    every pod. kopf's own service-account login names ``kubernetes.default.svc`` instead, which
    needs cluster DNS -- absent on a node without it, and for a ``hostNetwork`` pod."""
    host, port = env.get("KUBERNETES_SERVICE_HOST"), env.get("KUBERNETES_SERVICE_PORT")
    if not host or not port:
        return None
    return f"https://[{host}]:{port}" if ":" in host else f"https://{host}:{port}"


@kopf.on.login()
def login(**kwargs: Any) -> kopf.ConnectionInfo | None:
    """In a pod: the service account, at the address the pod's environment gives; elsewhere:
    $KUBECONFIG (read at login, not at import)."""
    info = kopf.login_with_service_account(**kwargs)
    if info is None:
        return kopf.login_with_kubeconfig(**kwargs)
    server = in_cluster_server(os.environ)
    return dataclasses.replace(info, server=server) if server else info


@kopf.on.probe(id="groups")
def probe(memo: kopf.Memo, **_: Any) -> int:
    """For the liveness endpoint: the operator's loop answers; the value is informational."""
    return int(memo.get("totals", {}).get("rounds", 0))


@kopf.on.resume(GROUP, VERSION, PLURAL)
@kopf.on.create(GROUP, VERSION, PLURAL)
@kopf.on.update(GROUP, VERSION, PLURAL, field="spec")
def run_group(body: kopf.Body, spec: kopf.Spec, memo: kopf.Memo, patch: kopf.Patch, **_: Any) -> None:
    try:
        group = parse_group(dict(spec))
    except SpecError as e:
        message = f"invalid spec: {e}"
        patch.status["conditions"] = conditions(ready=False, balanced=False, degraded=True, reason="InvalidSpec",
                                                message=message)  # fmt: skip
        kopf.warn(body, reason="InvalidSpec", message=message)
        raise kopf.PermanentError(message) from e
    metrics.forget(body.metadata["namespace"], body.metadata["name"], frozenset(m.name for m in group.models))
    objects = manifests(dict(body), group)
    for obj in objects:
        apply(memo.dynamic, obj)
    kopf.info(body, reason="Applied", message=f"{len(objects)} objects for {len(group.models)} models")
    patch.status["observedGeneration"] = body.metadata.get("generation")


@kopf.on.delete(GROUP, VERSION, PLURAL, optional=True)
def forget_group(name: str, namespace: str | None, **_: Any) -> None:
    """The group's series go with it (``optional``: no finalizer, deletion never waits on us)."""
    metrics.forget(namespace or "", name)


def apply(dyn: DynamicClient, obj: dict[str, Any]) -> None:
    kind, ns = obj["kind"], obj["metadata"].get("namespace")
    try:
        resource = dyn.resources.get(api_version=obj["apiVersion"], kind=kind)
    except ResourceNotFoundError as e:
        hint = " (dra mode needs Kubernetes >= 1.34 with the DRA API; use workload.mode: devicePlugin)"
        raise kopf.PermanentError(f"the cluster does not serve {obj['apiVersion']} {kind}{hint}") from e
    try:
        dyn.server_side_apply(resource, body=obj, namespace=ns, field_manager=FIELD_MANAGER, force_conflicts=True)
    except k8s.ApiException as e:
        if e.status in (409, 429) or (e.status or 500) >= 500:
            raise kopf.TemporaryError(f"applying {kind} {obj['metadata']['name']}: {e.reason} {e.body}", delay=5) from e
        raise kopf.PermanentError(f"applying {kind} {obj['metadata']['name']}: {e.status} {e.body}") from e


def discover(dyn: DynamicClient, namespace: str, name: str) -> dict[str, dict[str, Endpoint]]:
    """pod address -> model -> endpoint, from the per-model Services' EndpointSlices."""
    slices = dyn.resources.get(group="discovery.k8s.io", kind="EndpointSlice")  # v1beta1 on 1.20, v1 later
    items = dyn.get(slices, namespace=namespace, label_selector=slice_selector(name)).to_dict()["items"]
    pods: dict[str, dict[str, Endpoint]] = defaultdict(dict)
    for ep in endpoints_from_slices(items):
        pods[ep.pod][ep.model] = ep
    return dict(pods)


def admin_token(api: k8s.ApiClient, namespace: str, secret: str) -> str | None:
    if not secret:
        return None
    data = k8s.CoreV1Api(api).read_namespaced_secret(secret, namespace).data or {}
    if "token" not in data:
        raise kopf.TemporaryError(f"Secret {secret} has no key 'token'", delay=30)
    return base64.b64decode(data["token"]).decode().strip()


#: the timer's tick: a round starts within a tick of its interval. The demand policy counts in rounds,
#: so their cadence is its reaction time: a 1-s timer sleeping after each round, from a last round
#: timed at its end, ran a "1 s" interval every 1.3-2 s, and 2-s rounds served alternating bursts at
#: 0.79x a static split's p99 TTFT where 1-s rounds did 0.25x (stop 52).
TICK_S = 0.25


def due(status: Any, interval_s: float, last_start: float | None, now_s: float) -> bool:
    """A round is due ``interval_s`` after the last one started (within half a tick): as this
    operator timed it (``last_start``, monotonic, like ``now_s``), or after a restart as the status
    says (``balance.lastRoundTime``, whole seconds). The status a timer is handed can be a round
    old: read alone, a tick before the patch came back would start a second round at once."""
    if last_start is not None:
        elapsed = now_s - last_start
    elif last := (status.get("balance") or {}).get("lastRoundTime"):
        elapsed = (dt.datetime.now(dt.UTC) - dt.datetime.fromisoformat(last.replace("Z", "+00:00"))).total_seconds()
    else:
        return True
    return elapsed >= interval_s - TICK_S / 2


class _QuietTicks(logging.Filter):
    """Drop kopf's "Timer 'balance' succeeded." line: four a second a group, one per tick."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith("Timer 'balance' succeeded")


_QUIET_TICKS = _QuietTicks()  # one instance: a restarted startup handler adds no second filter


@kopf.timer(GROUP, VERSION, PLURAL, interval=TICK_S, sharp=True, initial_delay=2.0)
def balance(body: kopf.Body, spec: kopf.Spec, status: kopf.Status, memo: kopf.Memo, patch: kopf.Patch,
            name: str, namespace: str | None, **_: Any) -> None:  # fmt: skip
    assert namespace is not None  # the resource is namespaced
    try:
        group = parse_group(dict(spec))
    except SpecError:
        return  # run_group reported it
    started = time.monotonic()
    if not due(status, group.interval_s, memo.get("last_round_start"), started):
        return
    memo.last_round_start, started_at = started, now()
    pods = discover(memo.dynamic, namespace, name)
    previous = {(m["pod"], m["name"]): m for m in status.get("models") or []}
    client = AdminClient(admin_token(memo.api, namespace, group.workload.admin_token_secret))
    rounds: list[PodRound] = []
    labels = {"namespace": namespace, "group": name}
    with metrics.ROUND_SECONDS.labels(**labels).time():
        try:
            balancer = Balancer(client, wait_s=min(10.0, group.interval_s))
            for pod, eps in sorted(pods.items()):
                known = {n: p["limitBytes"] for (pp, n), p in previous.items() if pp == pod and "limitBytes" in p}
                preempt = {n: p.get("preemptions", 0) for (pp, n), p in previous.items() if pp == pod}
                memory = memo.setdefault("policy_memory", {})  # the policy's, per pod, while this operator lives
                rounds.append(r := balancer.round(group, pod, eps, known, preempt, memory.get(pod)))
                memory[pod] = r.memory
        finally:
            client.close()
    metrics.ROUNDS.labels(**labels).inc()
    memo.totals["rounds"] += 1  # shared with the probe's memo (a per-group memo is a shallow copy)
    metrics.BUDGET.labels(**labels).set(group.policy.budget_bytes)
    metrics.PODS.labels(**labels).set(len(rounds))
    metrics.DEGRADED.labels(**labels).set(int(degraded(rounds)))
    for z in (z for r in rounds for z in r.resizes):
        metrics.RESIZES.labels(**labels, model=z.model, status=z.status).inc()
    memo.warned = report(body, patch, group, rounds, previous, started_at, memo.get("warned", frozenset()))


def report(body: kopf.Body, patch: kopf.Patch, group: GroupSpec, rounds: list[PodRound],
           previous: dict[tuple[str, str], dict[str, Any]], started_at: str,
           warned: frozenset[str]) -> frozenset[str]:  # fmt: skip
    """Status and Events of a round that started at ``started_at``; returns the round's warnings. A
    warning the round before posted (``warned``: the same failed resize, the same problem) posts no
    second Event: a server down for a minute would post sixty at the default interval."""
    warnings: set[str] = set()
    for r in rounds:
        for z in r.resizes:
            message = f"{z.model} on {z.pod}: {z.old_bytes} -> {z.new_bytes} bytes ({z.status})"
            if z.status in ("applied", "deferred"):
                kopf.event(body, type="Normal", reason="Resized", message=message)
                continue
            warnings.add(message)
            if message not in warned:
                kopf.event(body, type="Warning", reason="ResizeFailed", message=message)
        for problem in r.problems:
            warnings.add(problem)
            if problem not in warned:
                kopf.event(body, type="Warning", reason="Degraded", message=problem)
    models = [model_status(r, m.name, previous.get((r.pod, m.name))) for r in rounds for m in group.models]
    ready = bool(rounds) and all(len(r.snapshots) == len(group.models) for r in rounds)
    is_degraded = degraded(rounds)
    reason = "NoEndpoints" if not rounds else ("Degraded" if is_degraded else "Balanced")
    message = "; ".join(p for r in rounds for p in r.problems) or ("no ready pods found" if not rounds else "")
    patch.status["models"] = models
    patch.status["conditions"] = conditions(ready, all(r.balanced for r in rounds) and bool(rounds), is_degraded,
                                            reason, message)  # fmt: skip
    patch.status["balance"] = {"lastRoundTime": started_at, "pods": len(rounds)}
    return frozenset(warnings)
