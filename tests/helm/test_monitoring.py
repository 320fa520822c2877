"""A real Prometheus scrapes the stack the way a cluster's does, and the dashboard is proven on it.

The stack: a group pod's processes (the group launcher: two real kvpool-servers with the CPU tier
and the router) and the operator, on 127.0.0.1. The session's API server holds what a cluster
would: the chart's operator Service, the group's Services (built by the operator), Pods made from
the Deployments' templates and EndpointSlices pointing at the local ports (the endpoint-slice
controller's job). Prometheus discovers the targets with ``kubernetes_sd_configs`` and the
relabelling of the chart's own ServiceMonitors (:mod:`tests.helm.monitoring`) and evaluates the
chart's rules. After a short load and a budget cut that makes the operator shrink both pools:
every target is up with the labels the dashboard and alerts join on, every panel's query returns
data, promtool finds nothing wrong with our /metrics, a deleted group's series go, and a group pod
that stops turns its server-down alerts pending."""

from __future__ import annotations

import math
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from kubernetes import client as k8s
from kubernetes import config as k8s_config
from kvpool_operator.crd import GROUP, PLURAL, VERSION, build_crd

from tests.helm.monitoring import PROMTOOL, Prometheus, discovery_of, rule_groups, scrape_configs, start_prometheus
from tests.helm.test_chart import CHART, MONITORING, helm
from tests.k8s.cluster import Cluster
from tests.server.conftest import TOKEN, free_port, wait_ready

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

NS, OP_NS, POD = "kvmon", "kvpool-monitoring", "g-0"
MiB = 1 << 20
DASHBOARD = CHART / "dashboards" / "kvpool.json"


@dataclass
class Stack:
    api: k8s.ApiClient
    prom: Prometheus
    group: subprocess.Popen[bytes]
    operator: subprocess.Popen[bytes]
    router_url: str
    server_urls: dict[str, str]
    operator_url: str
    dir: Path


def wait_for(check: Callable[[], Any], timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.5)
    raise AssertionError(f"timed out waiting for {what}")


def free_ports(n: int) -> int:
    """A port P with P+1 .. P+n-1 free too (the launcher puts the servers after the router), and
    their admin ports P+101 .. P+n+99."""
    for _ in range(50):
        p = free_port()
        try:
            for q in [*range(p, p + n), *range(p + 101, p + n + 100)]:
                with socket.socket() as s:
                    s.bind(("127.0.0.1", q))
            return p
        except OSError:
            continue
    raise RuntimeError("no run of free ports")


def endpoint_slice(
    ns: str,
    service: str,
    port: int,
    pod: str,
    labels: dict[str, str],
    port_name: str = "http",
    admin_port: int | None = None,
) -> dict[str, Any]:
    """What the endpoint-slice controller writes for a ready pod behind ``service`` (our 'pod'
    listens on 127.0.0.1); the Service's labels are mirrored onto it, as the controller does."""
    return {
        "apiVersion": "discovery.k8s.io/v1beta1", "kind": "EndpointSlice", "addressType": "IPv4",
        "metadata": {"name": f"{service}-local", "namespace": ns, "labels": {
            **labels, "kubernetes.io/service-name": service, "endpointslice.kubernetes.io/managed-by": "kvpool-tests"}},
        "ports": [{"name": port_name, "port": port, "protocol": "TCP"}]
        + ([{"name": "admin", "port": admin_port, "protocol": "TCP"}] if admin_port else []),
        "endpoints": [{"addresses": ["127.0.0.1"], "conditions": {"ready": True},
                       "targetRef": {"kind": "Pod", "name": pod, "namespace": ns}}],
    }  # fmt: skip


def create_slice(api: k8s.ApiClient, body: dict[str, Any]) -> None:
    ns = body["metadata"]["namespace"]
    k8s.CustomObjectsApi(api).create_namespaced_custom_object("discovery.k8s.io", "v1beta1", ns, "endpointslices", body)


def pod_from(api: k8s.ApiClient, deployment: Any, name: str) -> None:
    """What the ReplicaSet controller does: a Pod from the Deployment's template (it stays Pending:
    no scheduler; Prometheus only needs the object for the pod and container labels)."""
    template = api.sanitize_for_serialization(deployment.spec.template)
    ns = deployment.metadata.namespace
    body = {"apiVersion": "v1", "kind": "Pod", "spec": template["spec"],
            "metadata": {"name": name, "namespace": ns, "labels": template["metadata"].get("labels", {})}}  # fmt: skip
    k8s.CoreV1Api(api).create_namespaced_pod(ns, body)


def admin_api(cluster: Cluster) -> k8s.ApiClient:
    api = k8s_config.new_client_from_config(config_file=str(cluster.kubeconfig()))
    try:
        k8s.ApiextensionsV1Api(api).create_custom_resource_definition(build_crd())
    except k8s.ApiException as e:
        if e.status != 409:  # another module of the session created it
            raise
    ext = k8s.ApiextensionsV1Api(api)
    wait_for(lambda: any(c.type == "Established" and c.status == "True"
                         for c in ext.read_custom_resource_definition(f"{PLURAL}.{GROUP}").status.conditions or []),
             60, "the CRD")  # fmt: skip
    for ns in (NS, OP_NS):
        k8s.CoreV1Api(api).create_namespace({"metadata": {"name": ns}})
    secret = {"metadata": {"name": "admin-token"}, "stringData": {"token": TOKEN}}
    k8s.CoreV1Api(api).create_namespaced_secret(NS, secret)
    return api


def start_group(tiny: Path, d: Path) -> tuple[subprocess.Popen[bytes], int]:
    (d / "token").write_text(TOKEN)
    port = free_ports(3)
    extra = f"--limit-bytes 96Mi --virtual-bytes 512Mi --admin-token-file {d / 'token'} --offload-bytes 32Mi"
    extra += f" --offload-dir {d}"
    cmd = [sys.executable, "-m", "kvpool_server.group", "--serve", f"a={tiny}", "--serve", f"b={tiny}",
           "--port", str(port), "--server-args", extra]  # fmt: skip
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(cmd, stdout=(d / "group.log").open("wb"), stderr=subprocess.STDOUT, env=env)
    wait_ready(proc, f"http://127.0.0.1:{port}", d / "group.log", timeout_s=300)  # the router: both servers ready
    return proc, port


def start_operator(cluster: Cluster, d: Path) -> tuple[subprocess.Popen[bytes], int]:
    port = free_port()
    cmd = [sys.executable, "-m", "kvpool_operator", "--standalone", "--namespace", NS, "--metrics-port", str(port),
           "--metrics-address", "127.0.0.1"]  # fmt: skip
    env = {**os.environ, "KUBECONFIG": str(cluster.kubeconfig())}
    proc = subprocess.Popen(cmd, stdout=(d / "operator.log").open("wb"), stderr=subprocess.STDOUT, env=env)
    wait_for(lambda: _answers(f"http://127.0.0.1:{port}/metrics"), 60, "the operator's metrics")
    return proc, port


def _answers(url: str) -> bool:
    try:
        return httpx.get(url, timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def register_operator(api: k8s.ApiClient, docs: list[dict[str, Any]], port: int) -> None:
    (svc,) = [d for d in docs if d["kind"] == "Service"]
    (dep,) = [d for d in docs if d["kind"] == "Deployment"]
    k8s.CoreV1Api(api).create_namespaced_service(OP_NS, svc)
    k8s.AppsV1Api(api).create_namespaced_deployment(OP_NS, dep)
    pod = f"{dep['metadata']['name']}-0"
    pod_from(api, k8s.AppsV1Api(api).read_namespaced_deployment(dep["metadata"]["name"], OP_NS), pod)
    create_slice(api, endpoint_slice(OP_NS, svc["metadata"]["name"], port, pod, svc["metadata"]["labels"], "metrics"))


def register_group(api: k8s.ApiClient, port: int) -> None:
    """The group's pod: the router on ``port``, model a on port+1, b on port+2 (the launcher's order)."""
    apps, core = k8s.AppsV1Api(api), k8s.CoreV1Api(api)
    dep = wait_for(lambda: _maybe(lambda: apps.read_namespaced_deployment("g", NS)), 60, "the group's Deployment")
    pod_from(api, dep, POD)
    services = {"g": port, "g-a": port + 1, "g-b": port + 2}
    for name, p in services.items():
        svc = wait_for(lambda n=name: _maybe(lambda: core.read_namespaced_service(n, NS)), 60, f"Service {name}")
        admin_port = p + 100 if name != "g" else None  # the launcher's admin ports
        create_slice(api, endpoint_slice(NS, name, p, POD, svc.metadata.labels, admin_port=admin_port))


def _maybe(read: Callable[[], Any]) -> Any:
    try:
        return read()
    except k8s.ApiException as e:
        if e.status == 404:
            return None
        raise


def group_body(budget: str) -> dict[str, Any]:
    models = [{"name": m, "model": "/models/tiny", "minBytes": "32Mi", "maxBytes": "224Mi"} for m in "ab"]
    return {
        "apiVersion": f"{GROUP}/{VERSION}", "kind": "ColocatedModels", "metadata": {"name": "g"},
        "spec": {"gpuMemoryBudgetBytes": budget, "models": models, "workload": {"adminTokenSecret": "admin-token"},
                 "rebalance": {"intervalSeconds": 2, "hysteresisBytes": "4Mi", "maxStepBytes": "64Mi"}},
    }  # fmt: skip


def load(router: str, seconds: float) -> int:
    """Completions for both models through the group endpoint; prompts share prefixes (tier lookups)."""
    done, stop = [0], time.monotonic() + seconds

    def one(i: int) -> None:
        with httpx.Client(base_url=router, timeout=120) as c:
            while time.monotonic() < stop:
                prompt = list(range(5, 5 + 200 + (i % 3) * 40))
                body = {"model": "ab"[i % 2], "prompt": [prompt], "max_tokens": 16, "ignore_eos": True}
                if c.post("/v1/completions", json=body).status_code == 200:
                    done[0] += 1

    threads = [threading.Thread(target=one, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return done[0]


@pytest.fixture(scope="module")
def stack(cluster: Cluster, tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    d = tmp_path_factory.mktemp("monitoring")
    api = admin_api(cluster)
    docs = [x for x in _render() if x]
    group, port = start_group(tiny_model, d)
    operator, op_port = start_operator(cluster, d)
    prom: Prometheus | None = None
    try:
        register_operator(api, docs, op_port)
        k8s.CustomObjectsApi(api).create_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, group_body("320Mi"))
        register_group(api, port)
        monitors = [x for x in docs if x["kind"] == "ServiceMonitor"]
        scrape = [c for m in monitors for c in scrape_configs(m, discovery_of(cluster), "1s")]
        prom = start_prometheus(d, scrape, rule_groups(docs))
        wait_for(lambda: len([t for t in prom.targets() if t["health"] == "up"]) == 4, 60, "4 targets up")
        time.sleep(3)  # a few samples before the load: rates see what follows
        served = load(f"http://127.0.0.1:{port}", 8)
        k8s.CustomObjectsApi(api).patch_namespaced_custom_object(  # the operator must shrink both pools
            GROUP, VERSION, NS, PLURAL, "g", {"spec": {"gpuMemoryBudgetBytes": "160Mi"}}
        )
        served += load(f"http://127.0.0.1:{port}", 12)
        print(f"served {served} completions through the router")
        wait_for(lambda: prom.query('sum(increase(kvpool_resize_total{status="applied"}[5m])) > 0'), 60,
                 "an applied resize seen by Prometheus")  # fmt: skip
        time.sleep(3)
        urls = {m: f"http://127.0.0.1:{port + i}" for i, m in enumerate("ab", start=1)}
        yield Stack(api, prom, group, operator, f"http://127.0.0.1:{port}", urls, f"http://127.0.0.1:{op_port}", d)
    finally:
        for p in (group, operator):
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
                try:
                    p.wait(timeout=60)
                except subprocess.TimeoutExpired:
                    p.kill()
        if prom is not None:
            prom.stop()


def _render() -> list[dict[str, Any]]:
    import yaml

    out = helm("template", "mon", str(CHART), "--namespace", OP_NS, *MONITORING).stdout
    return list(yaml.safe_load_all(out))


def test_prometheus_finds_every_target_through_the_charts_service_monitors(stack: Stack) -> None:
    targets = stack.prom.targets()
    jobs = sorted(t["labels"]["job"] for t in targets)
    assert jobs == ["kvpool-model-server", "kvpool-model-server", "kvpool-operator", "kvpool-router"], targets
    assert {t["health"] for t in targets} == {"up"}
    for t in (t for t in targets if t["labels"]["job"] != "kvpool-operator"):
        assert {k: t["labels"][k] for k in ("namespace", "group", "pod")} == {"namespace": NS, "group": "g", "pod": POD}
    (op,) = [t for t in targets if t["labels"]["job"] == "kvpool-operator"]
    assert op["labels"]["namespace"] == OP_NS
    assert op["labels"]["pod"].startswith("mon-kvpool-operator")


def test_every_series_carries_the_labels_that_the_dashboard_and_alerts_join_on(stack: Stack) -> None:
    q = stack.prom.query
    limits = {(r["metric"]["namespace"], r["metric"]["group"], r["metric"]["model"], r["metric"]["pod"])
              for r in q("kvpool_limit_bytes")}  # fmt: skip
    assert limits == {(NS, "g", "a", POD), (NS, "g", "b", POD)}
    (budget,) = q('kvpool_group_budget_bytes{group="g"}')  # honorLabels: the group's namespace, not the operator's
    assert budget["metric"]["namespace"] == NS
    assert float(budget["value"][1]) == 160 * MiB
    assert {r["metric"]["model_name"] for r in q(f'vllm:num_requests_running{{namespace="{NS}", group="g"}}')} == {
        "a",
        "b",
    }
    assert {r["metric"]["model"] for r in q('kvpool_router_requests_total{group="g", code="200"}')} == {"a", "b"}
    (ratio,) = q(f'kvpool:group_budget:used_ratio{{namespace="{NS}", group="g"}}')
    assert ratio["metric"]["pod"] == POD
    assert 0 < float(ratio["value"][1]) <= 1
    limit_sum = sum(float(r["value"][1]) for r in q(f'kvpool_limit_bytes{{namespace="{NS}"}}'))
    assert limit_sum <= 160 * MiB  # the operator's shrinks, seen through Prometheus
    alerts = q('ALERTS{alertname=~"KVPoolServerDown|KVPoolRouterDown|KVPoolGroupDegraded"}')
    assert alerts == []  # a healthy group: nothing pending or firing


def grafana_values(prom: Prometheus, query: str, variables: dict[str, str]) -> list[str]:
    """A ``label_values(selector, label)`` variable as Grafana resolves it."""
    m = re.fullmatch(r"label_values\((.*), (\w+)\)", query)
    assert m, query
    selector, label = substitute(m.group(1), variables), m.group(2)
    return sorted({r["metric"][label] for r in prom.query(f"group by ({label}) ({selector})")})


def substitute(expr: str, variables: dict[str, str]) -> str:
    for name, value in sorted(variables.items(), key=lambda kv: -len(kv[0])):
        expr = expr.replace(f"${name}", value)
    return expr


def finite(result: list[dict[str, Any]]) -> bool:
    return any(math.isfinite(float(r["value"][1])) for r in result)


def dashboard_queries(prom: Prometheus) -> list[tuple[str, str]]:
    """(panel title, query) for every target of every panel, the variables substituted as Grafana
    does (multi-value: a regex alternation of the values; a repeated row: once per value)."""
    import json

    dash = json.loads(DASHBOARD.read_text())
    variables: dict[str, str] = {}
    values: dict[str, list[str]] = {}
    for v in dash["templating"]["list"]:
        if v["type"] == "query":
            values[v["name"]] = grafana_values(prom, v["query"]["query"], variables)
            assert values[v["name"]], f"variable {v['name']} has no values"
            variables[v["name"]] = "(" + "|".join(re.escape(x) for x in values[v["name"]]) + ")"
    out, repeat = [], None
    for p in dash["panels"]:
        if p["type"] == "row":
            repeat = p.get("repeat")
            continue
        for t in p["targets"]:
            for value in values[repeat] if repeat else [None]:
                vs = {**variables, **({repeat: value} if repeat and value else {})}
                out.append((substitute(p["title"], vs), substitute(t["expr"], vs)))
    return out


def test_every_dashboard_panel_returns_data(stack: Stack) -> None:
    queries = dashboard_queries(stack.prom)
    assert len(queries) >= 30
    empty = [(title, expr) for title, expr in queries if not finite(stack.prom.query(expr))]
    assert empty == []
    if target := os.environ.get("KVPOOL_DASHBOARD_PNG"):
        from tests.helm.picture import draw

        draw(stack.prom, Path(target))


def promtool_problems(url: str) -> list[str]:
    body = httpx.get(url + "/metrics", timeout=30).text
    out = subprocess.run([str(PROMTOOL), "check", "metrics"], input=body, capture_output=True, text=True, timeout=60)
    return [line for line in (out.stdout + out.stderr).splitlines() if line.strip()]


def test_our_metrics_pass_promtool_check_metrics(stack: Stack) -> None:
    for url in (stack.server_urls["a"], stack.router_url, stack.operator_url):
        problems = promtool_problems(url)
        ours = [p for p in problems if p.startswith("kvpool")]
        print(f"{url}: {len(problems)} promtool remarks, {len(ours)} on kvpool series; others: {problems[:5]}")
        assert ours == [], url


def test_a_deleted_group_takes_its_operator_series_with_it(stack: Stack) -> None:
    def group_lines() -> list[str]:
        text = httpx.get(stack.operator_url + "/metrics", timeout=10).text
        return [x for x in text.splitlines() if 'group="g"' in x and not x.startswith("#")]

    assert group_lines()
    k8s.CustomObjectsApi(stack.api).delete_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, "g")
    wait_for(lambda: not group_lines(), 30, "the operator to drop group g's series")


def test_a_group_pod_that_stops_turns_its_down_alerts_pending(stack: Stack) -> None:
    stack.group.send_signal(signal.SIGTERM)
    stack.group.wait(timeout=120)

    def pending() -> list[str]:
        result = stack.prom.query('ALERTS{alertstate="pending", alertname=~"KVPoolServerDown|KVPoolRouterDown"}')
        return sorted(r["metric"]["alertname"] + ":" + r["metric"]["service"] for r in result)

    got = wait_for(lambda: len(pending()) == 3 and pending(), 30, "the down alerts pending")
    assert got == ["KVPoolRouterDown:g", "KVPoolServerDown:g-a", "KVPoolServerDown:g-b"]
