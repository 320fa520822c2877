"""The operator against a real Kubernetes API server (1.20, started by the session) and two real
kvpool-server processes on this machine, registered as the group's endpoints through
EndpointSlices -- the discovery path the operator uses in a cluster. It builds the workload,
rejects bad specs with clear messages, moves memory toward the loaded model (shrinks first, the
sum of limits within the budget at every sample), posts Events, and runs with exactly the
chart's ClusterRole."""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import signal
import threading
import time
from pathlib import Path

import httpx
import pytest
from kubernetes import client as k8s
from kubernetes import config as k8s_config
from kvpool_operator.crd import GROUP, PLURAL, VERSION
from kvpool_operator.rbac import cluster_role

from tests.k8s.cluster import TOKEN, TOKEN_USER, Cluster
from tests.operator.kube import LIVENESS, NS, OPERATOR, TWO, MiB, create, events, get, group_body, register, wait_for
from tests.server.conftest import TOKEN as ADMIN_TOKEN
from tests.server.conftest import Server, flood

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


def test_a_group_gets_its_workload_owned_by_it(admin: k8s.ApiClient, operator: None) -> None:
    cr = create(admin, group_body("g1", TWO))
    apps, core = k8s.AppsV1Api(admin), k8s.CoreV1Api(admin)
    dep = wait_for(lambda: apps.read_namespaced_deployment("g1", NS), what="the Deployment")
    container = dep.spec.template.spec.containers[0]
    assert container.command == ["python", "-m", "kvpool_server.group"]
    assert container.resources.limits == {"nvidia.com/gpu": "1"}
    names = {s.metadata.name for s in core.list_namespaced_service(NS, label_selector=f"{GROUP}/group=g1").items}
    assert names == {"g1", "g1-a", "g1-b"}
    for obj in [dep, *core.list_namespaced_service(NS, label_selector=f"{GROUP}/group=g1").items]:
        (ref,) = obj.metadata.owner_references
        assert (ref.kind, ref.name, ref.uid, ref.controller) == ("ColocatedModels", "g1", cr["metadata"]["uid"], True)
    # the spec changes roll out: one more replica
    k8s.CustomObjectsApi(admin).patch_namespaced_custom_object(
        GROUP, VERSION, NS, PLURAL, "g1", {"spec": {"workload": {"replicas": 2}}}
    )
    wait_for(lambda: apps.read_namespaced_deployment("g1", NS).spec.replicas == 2, what="the rollout")


def test_bad_specs_are_refused_with_messages_that_name_the_field(admin: k8s.ApiClient, operator: None) -> None:
    with pytest.raises(k8s.ApiException) as schema:  # the CRD schema: at admission
        create(admin, group_body("bad1", [{**TWO[0], "minBytes": "lots"}]))
    assert schema.value.status == 422
    assert "spec.models.minBytes in body should match" in schema.value.body  # 1.20 names the field without index
    create(admin, group_body("bad2", [{**TWO[0], "minBytes": "200Mi", "maxBytes": "100Mi"}]))  # admitted ...
    cond = wait_for(lambda: {c["type"]: c for c in get(admin, "bad2").get("status", {}).get("conditions", [])},
                    what="the InvalidSpec condition")  # fmt: skip
    assert cond["Ready"]["reason"] == "InvalidSpec"
    assert "spec.models[0]: minBytes" in cond["Ready"]["message"]
    assert any(e.reason == "InvalidSpec" for e in events(admin, "bad2"))
    with pytest.raises(k8s.ApiException):
        k8s.AppsV1Api(admin).read_namespaced_deployment("bad2", NS)  # ... but nothing was built


def test_the_operator_moves_memory_toward_the_loaded_model(
    admin: k8s.ApiClient, operator: None, servers: dict[str, Server]
) -> None:
    budget, start = 256 * MiB, 128 * MiB
    for model, server in servers.items():
        register(admin, "g2", model, server)
    create(
        admin,
        group_body(
            "g2",
            TWO,
            workload={"adminTokenSecret": "admin-token"},
            rebalance={"intervalSeconds": 2, "hysteresisBytes": "8Mi", "maxStepBytes": "64Mi"},
        ),
    )
    wait_for(lambda: len([m for m in get(admin, "g2").get("status", {}).get("models", []) if m["reachable"]]) == 2,
             what="both pools observed")  # fmt: skip
    stop = threading.Event()
    flood_a = {"max_tokens": 64, "timeout": 120}
    loader = threading.Thread(target=flood, args=(servers["a"].url, "tiny", stop), kwargs=flood_a, daemon=True)
    admins = {m: s.admin() for m, s in servers.items()}
    t0 = time.monotonic()
    loader.start()
    try:
        while True:
            snaps = {m: c.get("/kvpool").json() for m, c in admins.items()}
            limits = {m: s["limit_bytes"] for m, s in snaps.items()}
            assert sum(limits.values()) <= budget, limits  # shrinks first: never over budget
            if limits["a"] > start and limits["b"] < start and snaps["a"]["mapped_bytes"] > start:
                break
            assert time.monotonic() - t0 < 150, f"memory did not move toward the loaded model: {snaps}"
            time.sleep(0.2)
        print(f"reaction: {time.monotonic() - t0:.1f} s from the load step to a's grown limit in use")
    finally:
        stop.set()
        loader.join(timeout=180)

    # The round posts its Events after its last resize: a's grant is in use on the server before
    # the operator has reported it (CI read the events in between and saw only b's shrinks).
    def resized() -> list[str]:
        return [e.message for e in events(admin, "g2") if e.reason == "Resized"]

    wait_for(lambda: any(m.startswith("a on 127.0.0.1") for m in resized()), timeout=30, what="a's grant Event")
    assert any(m.startswith("b on 127.0.0.1") for m in resized()), resized()  # and b's shrink
    status = wait_for(lambda: {m["name"]: m for m in get(admin, "g2")["status"]["models"]}, what="status")
    assert status["a"]["limitBytes"] > start
    assert ADMIN_TOKEN not in json.dumps(get(admin, "g2")), "the resource holds the admin token"
    assert not [e for e in events(admin, "g2") if ADMIN_TOKEN in (e.message or "")]
    for c in admins.values():
        assert c.get("/kvpool/integrity").json() == {"ok": True}
    from prometheus_client import REGISTRY

    labels = {"namespace": NS, "group": "g2"}  # the operator's own series (same process: KopfRunner)
    assert (REGISTRY.get_sample_value("kvpool_operator_resizes_total", {**labels, "model": "a", "status": "applied"})
            or 0) >= 1  # fmt: skip
    assert REGISTRY.get_sample_value("kvpool_group_budget_bytes", labels) == budget


@pytest.mark.parametrize("outage", ["frozen", "restarted"])
def test_an_api_server_gone_for_a_minute_leaves_limits_and_serving_alone_and_rounds_resume(
    cluster: Cluster, admin: k8s.ApiClient, operator: None, servers: dict[str, Server], outage: str
) -> None:
    """The API server gone for 60 s -- frozen (SIGSTOP: requests hang, as behind a partition) or
    stopped and started again (SIGTERM, as in a control-plane upgrade; etcd keeps the state): the
    model servers keep serving, their limits stay as they were, and the operator reconnects and
    its rounds resume."""
    group = f"g5{outage[0]}"
    for g in ("g2", "g5f", "g5r"):  # one group at a time over these servers
        with contextlib.suppress(k8s.ApiException):
            k8s.CustomObjectsApi(admin).delete_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, g)
    for model, server in servers.items():
        register(admin, group, model, server)
    create(admin, group_body(group, TWO, workload={"adminTokenSecret": "admin-token"},
                             rebalance={"intervalSeconds": 2}))  # fmt: skip
    wait_for(lambda: get(admin, group).get("status", {}).get("balance"), what="a first round")
    admins = {m: s.admin() for m, s in servers.items()}
    limits = {m: c.get("/kvpool").json()["limit_bytes"] for m, c in admins.items()}
    if outage == "frozen":
        cluster.apiserver().send_signal(signal.SIGSTOP)
    else:
        cluster.stop_apiserver()
    served = 0
    try:
        until = time.monotonic() + 60
        while time.monotonic() < until:
            for server in servers.values():
                r = httpx.post(server.url + "/v1/completions", timeout=30,
                               json={"model": "tiny", "prompt": "still here", "max_tokens": 2})  # fmt: skip
                served += r.status_code == 200
            assert {m: c.get("/kvpool").json()["limit_bytes"] for m, c in admins.items()} == limits
            time.sleep(2)
    finally:
        if outage == "frozen":
            cluster.apiserver().send_signal(signal.SIGCONT)
        else:
            cluster.start_apiserver()
    resumed = dt.datetime.now(dt.UTC).replace(microsecond=0)

    def round_after() -> bool:
        last = get(admin, group)["status"]["balance"]["lastRoundTime"]
        return dt.datetime.fromisoformat(last.replace("Z", "+00:00")) > resumed

    wait_for(round_after, timeout=120, what="a round after the API server came back")
    print(f"API server {outage}: {served} completions served while it was gone; a round "
          f"{(dt.datetime.now(dt.UTC) - resumed).total_seconds():.0f} s or less after it came back")  # fmt: skip
    assert served >= 20
    assert {m: c.get("/kvpool").json()["limit_bytes"] for m, c in admins.items()} == limits


def test_servers_that_do_not_answer_make_the_group_degraded_and_keep_their_limits(
    admin: k8s.ApiClient, operator: None
) -> None:
    from tests.server.conftest import free_port

    for model in "ab":  # endpoints where nothing listens
        nowhere = f"http://127.0.0.1:{free_port()}"
        register(admin, "g4", model, Server(nowhere, None, Path(), nowhere))  # type: ignore[arg-type]
    create(admin, group_body("g4", TWO, rebalance={"intervalSeconds": 1}))
    cond = wait_for(lambda: {c["type"]: c for c in get(admin, "g4").get("status", {}).get("conditions", [])},
                    what="conditions")  # fmt: skip
    assert (cond["Degraded"]["status"], cond["Ready"]["status"]) == ("True", "False")
    assert "ConnectError" in cond["Degraded"]["message"]
    status = {m["name"]: m for m in get(admin, "g4")["status"]["models"]}
    assert {m["reachable"] for m in status.values()} == {False}
    assert all("lastResize" not in m for m in status.values())  # nothing was moved
    assert wait_for(lambda: [e for e in events(admin, "g4") if e.reason == "Degraded"], what="a Degraded event")
    rounds = get(admin, "g4")["status"]["balance"]["lastRoundTime"]
    time.sleep(4)  # four more 1-s rounds, each finding the same servers down
    assert get(admin, "g4")["status"]["balance"]["lastRoundTime"] > rounds
    posted = [e.message for e in events(admin, "g4") if e.reason == "Degraded"]
    assert len(posted) == len(set(posted)), posted  # each problem posted once, not once a round
    assert httpx.get(LIVENESS).json()["groups"] >= 4  # the probe counts every group's rounds


def test_the_operator_runs_with_exactly_the_charts_cluster_role(
    cluster: Cluster, admin: k8s.ApiClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    import kopf.testing

    rbac = k8s.RbacAuthorizationV1Api(admin)
    rbac.create_cluster_role(cluster_role("kvpool-operator-test"))
    rbac.create_cluster_role_binding({
        "metadata": {"name": "kvpool-operator-test"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "kvpool-operator-test"},
        "subjects": [{"kind": "User", "name": TOKEN_USER, "apiGroup": "rbac.authorization.k8s.io"}],
    })  # fmt: skip
    kubeconfig = cluster.kubeconfig(token=TOKEN)
    monkeypatch.setenv("KUBECONFIG", str(kubeconfig))
    with kopf.testing.KopfRunner(OPERATOR) as runner:
        create(admin, group_body("g3", TWO))
        wait_for(lambda: k8s.AppsV1Api(admin).read_namespaced_deployment("g3", NS), what="the Deployment")
        wait_for(lambda: get(admin, "g3").get("status", {}).get("conditions"), what="status written")
    assert runner.exception is None
    assert "Forbidden" not in runner.output, runner.output[-3000:]
    user = k8s_config.new_client_from_config(config_file=str(kubeconfig))
    for denied in (
        lambda: k8s.AppsV1Api(user).delete_namespaced_deployment("g3", NS),
        lambda: k8s.CoreV1Api(user).list_namespaced_secret(NS),
        lambda: k8s.CoreV1Api(user).create_namespace({"metadata": {"name": "nope"}}),
        lambda: k8s.CustomObjectsApi(user).delete_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, "g3"),
    ):
        with pytest.raises(k8s.ApiException) as e:
            denied()
        assert e.value.status == 403


@pytest.mark.parametrize(
    ("env", "server"),
    [
        ({"KUBERNETES_SERVICE_HOST": "10.96.0.1", "KUBERNETES_SERVICE_PORT": "443"}, "https://10.96.0.1:443"),
        ({"KUBERNETES_SERVICE_HOST": "fd00::1", "KUBERNETES_SERVICE_PORT": "6443"}, "https://[fd00::1]:6443"),
        ({"KUBERNETES_SERVICE_HOST": "10.96.0.1"}, None),
        ({}, None),
    ],
)
def test_in_a_pod_the_api_server_is_where_the_kubelet_says_not_a_dns_name(
    env: dict[str, str], server: str | None
) -> None:
    from kvpool_operator.handlers import in_cluster_server

    assert in_cluster_server(env) == server
