"""A user's day, on a real single-node cluster (``tests/k8s/node.py``): ``helm install`` of the chart
with a ``device: cpu`` group of two tiny models; the operator runs as a pod from the operator image
under the chart's ServiceAccount; the resource becomes a Deployment, a ReplicaSet and a Pod that
the scheduler places and the kubelet runs (non-root, read-only root filesystem, no capabilities,
seccomp); the EndpointSlice controller publishes the endpoints; load moves memory; a killed
container comes back; a rotated admin token reaches the pod and the operator without a restart; a
spec change rolls out; deleting the resource removes everything.

The images are the Dockerfile's ``operator`` and ``cpu`` targets built here by buildah
(``tools/k8s/images.sh``). The tests run in file order: each stage starts from the last one's state.
"""

from __future__ import annotations

import base64
import calendar
import json
import os
import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import httpx
import pytest

from tests.k8s.node import NodeCluster, build_images, pod_logs, start_node_cluster
from tests.k8s.up import NAMESPACE as NS
from tests.k8s.up import demo_values, helm_install
from tests.server.conftest import flood

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(1800)]

GROUP = "pair"
BUDGET = 256 << 20  # demo_values' gpuMemoryBudgetBytes
T = TypeVar("T")


def wait_for(what: str, fn: Callable[[], T | None], timeout: float, node: NodeCluster | None = None) -> T:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = fn()
        if value:
            return value
        time.sleep(1)
    extra = ("\n" + pod_logs(node, NS, "app.kubernetes.io/name=kvpool") + node.logs()[-6000:]) if node else ""
    raise AssertionError(f"{what}: not within {timeout:.0f} s{extra}")


@pytest.fixture(scope="module")
def node() -> Iterator[NodeCluster]:
    if os.geteuid() != 0:  # like the gpu tests: said, not failed, where the machine cannot
        pytest.skip("a node needs root (containerd, the kubelet, a bridge): run make test as root")
    images = build_images()
    d = Path(tempfile.mkdtemp(prefix="kvpool-node-"))  # short: containerd's socket path has a limit
    nc = start_node_cluster(d, images)
    yield nc
    nc.stop()
    assert not nc.leftovers()  # the node leaves nothing running or mounted on the host
    shutil.rmtree(d)


def pods(node: NodeCluster, selector: str) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = node.get("pods", "-n", NS, "-l", selector)["items"]
    return items


def ready(pod: dict[str, Any]) -> bool:
    conditions = pod.get("status", {}).get("conditions", [])
    return pod["metadata"].get("deletionTimestamp") is None and any(
        c["type"] == "Ready" and c["status"] == "True" for c in conditions
    )


def ready_pod(node: NodeCluster, selector: str, timeout: float) -> dict[str, Any]:
    def one() -> dict[str, Any] | None:
        found = [p for p in pods(node, selector) if ready(p)]
        return found[0] if len(found) == 1 else None

    return wait_for(f"a Ready pod for {selector}", one, timeout, node)


GROUP_POD = f"kvpool.dev/group={GROUP}"


def test_helm_install_runs_the_operator_as_a_pod_under_the_charts_identity(node: NodeCluster) -> None:
    out = node.kubectl("version", "-o", "json")
    assert json.loads(out.stdout)["serverVersion"]["gitVersion"] == "v1.20.2"
    helm_install(node, demo_values(node, GROUP))
    pod = ready_pod(node, "app.kubernetes.io/component=operator", 180)
    spec = pod["spec"]
    assert spec["nodeName"] == "node1"  # the scheduler bound it, the kubelet runs it
    assert spec["serviceAccountName"] == "kv-kvpool-operator"
    assert spec["containers"][0]["image"] == "ghcr.io/kvpool/kvpool-operator:0.1.0"
    assert spec["securityContext"]["runAsNonRoot"] is True
    (status,) = pod["status"]["containerStatuses"]
    assert status["ready"]
    assert status["restartCount"] == 0


def test_the_group_becomes_a_pod_whose_endpoints_the_controller_publishes(node: NodeCluster) -> None:
    dep = wait_for("the group's Deployment", lambda: node.get("deployments", "-n", NS, "-l", GROUP_POD)["items"],
                   60, node)  # fmt: skip
    assert len(dep) == 1
    rs = node.get("replicasets", "-n", NS, "-l", GROUP_POD)["items"]
    assert [r["metadata"]["ownerReferences"][0]["kind"] for r in rs] == ["Deployment"]
    pod = ready_pod(node, GROUP_POD, 900)
    spec = pod["spec"]
    assert spec["nodeName"] == "node1"
    assert spec["securityContext"]["runAsUser"] == 1000
    assert spec["securityContext"]["runAsNonRoot"]
    assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    (c,) = spec["containers"]
    assert c["securityContext"]["readOnlyRootFilesystem"] is True
    assert c["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert "nvidia.com/gpu" not in json.dumps(c.get("resources", {}))  # device: cpu
    assert c["image"] == "ghcr.io/kvpool/kvpool:0.1.0-cpu"
    ip = pod["status"]["podIP"]
    for model in "ab":  # written by the EndpointSlice controller, not by a test
        slices = node.get("endpointslices", "-n", NS, "-l", f"kubernetes.io/service-name={GROUP}-{model}")["items"]
        addresses = [a for s in slices for e in s.get("endpoints") or [] for a in e["addresses"]]
        assert addresses == [ip], slices
    for model in "ab":  # one OpenAI endpoint per group: the router, by pod IP
        r = httpx.post(f"http://{ip}:9000/v1/completions", timeout=120,
                       json={"model": model, "prompt": "hello", "max_tokens": 4, "ignore_eos": True})  # fmt: skip
        assert r.status_code == 200, r.text
        assert r.json()["usage"]["completion_tokens"] == 4
    logs = pod_logs(node, NS, GROUP_POD)
    assert "Traceback" not in logs, logs[-4000:]


def admin_token(node: NodeCluster) -> str:
    secret = node.get("secret", "kv-kvpool-admin-token", "-n", NS)  # the chart made it
    return base64.b64decode(secret["data"]["token"]).decode()


def pools(node: NodeCluster) -> dict[str, dict[str, Any]]:
    ip = ready_pod(node, GROUP_POD, 60)["status"]["podIP"]
    headers = {"authorization": f"Bearer {admin_token(node)}"}
    return {m: httpx.get(f"http://{ip}:{8000 + i}/kvpool", headers=headers, timeout=10).json()
            for i, m in enumerate("ab")}  # fmt: skip


def test_load_on_one_model_moves_memory_to_it_within_the_budget(node: NodeCluster) -> None:
    ip = ready_pod(node, GROUP_POD, 60)["status"]["podIP"]
    start = pools(node)
    assert sum(p["limit_bytes"] for p in start.values()) <= BUDGET
    stop = threading.Event()
    loader = threading.Thread(target=flood, args=(f"http://{ip}:9000", "a", stop), daemon=True)
    loader.start()
    samples = 0
    try:
        deadline = time.monotonic() + 300
        while True:
            snaps = pools(node)
            limits = {m: s["limit_bytes"] for m, s in snaps.items()}
            samples += 1
            assert sum(limits.values()) <= BUDGET, limits  # at every sample
            if limits["a"] > start["a"]["limit_bytes"] and limits["b"] < start["b"]["limit_bytes"]:
                break
            assert time.monotonic() < deadline, f"memory did not move toward the loaded model: {snaps}"
            time.sleep(0.5)
    finally:
        stop.set()
        loader.join(timeout=320)
    print(f"memory moved after {samples} samples: {limits}")
    for m, i in (("a", 0), ("b", 1)):
        r = httpx.get(f"http://{ip}:{8100 + i}/kvpool/integrity", timeout=10,
                      headers={"authorization": f"Bearer {admin_token(node)}"})  # fmt: skip
        assert r.json() == {"ok": True}, m


def group_row(node: NodeCluster) -> dict[str, str]:
    out = node.kubectl("get", "colocatedmodels", GROUP, "-n", NS).stdout.splitlines()
    return dict(zip(out[0].split(), out[1].split(), strict=False))


def test_the_resource_shows_ready_and_balanced_in_kubectl_get(node: NodeCluster) -> None:
    row = wait_for("Ready and Balanced", lambda: (r := group_row(node))["READY"] == "True"
                   and r["BALANCED"] == "True" and r, 120, node)  # fmt: skip
    assert row["NAME"] == GROUP


def test_a_killed_model_container_is_restarted_by_the_kubelet_and_found_again(node: NodeCluster) -> None:
    pod = ready_pod(node, GROUP_POD, 60)
    (status,) = pod["status"]["containerStatuses"]
    container = status["containerID"].removeprefix("containerd://")
    node.ctr("tasks", "kill", "--signal", "SIGKILL", container)
    restarted = wait_for("the kubelet's restart", lambda: [
        p for p in pods(node, GROUP_POD) if ready(p) and p["status"]["containerStatuses"][0]["restartCount"] >= 1
    ], 600, node)  # fmt: skip
    assert restarted[0]["metadata"]["name"] == pod["metadata"]["name"]  # the same pod: the kubelet, not a new one

    def found_again() -> bool:
        status = node.get("colocatedmodels", GROUP, "-n", NS).get("status", {})
        return all(m.get("reachable") for m in status.get("models", [])) and len(status.get("models", [])) == 2

    wait_for("the operator reaching both servers again", found_again, 120, node)


def test_a_rotated_admin_token_reaches_the_pod_and_the_operator_without_a_restart(node: NodeCluster) -> None:
    """The Secret changed in place: the kubelet refreshes the mounted file (within its sync period),
    the servers re-read it on the next request, the operator reads the Secret each round. No pod
    restarts; the old token is refused once the file has changed; rounds succeed with the new one."""
    pod = ready_pod(node, GROUP_POD, 60)
    ip, restarts = pod["status"]["podIP"], pod["status"]["containerStatuses"][0]["restartCount"]
    old, new = admin_token(node), f"rotated-{os.urandom(8).hex()}"
    node.kubectl("patch", "secret", "kv-kvpool-admin-token", "-n", NS, "--type", "merge",
                 "-p", json.dumps({"stringData": {"token": new}}))  # fmt: skip
    rotated = time.monotonic()

    def integrity(token: str) -> int:
        url = f"http://{ip}:8100/kvpool/integrity"
        return httpx.get(url, headers={"authorization": f"Bearer {token}"}, timeout=10).status_code

    wait_for("the pod taking the new token", lambda: integrity(new) == 200, 300, node)
    took = time.monotonic() - rotated
    assert integrity(old) == 403
    after = time.time() + 1

    def round_with_new_token() -> bool:
        status = node.get("colocatedmodels", GROUP, "-n", NS).get("status", {})
        last = status.get("balance", {}).get("lastRoundTime", "1970-01-01T00:00:00Z")
        since = calendar.timegm(time.strptime(last, "%Y-%m-%dT%H:%M:%SZ")) > after
        return since and all(m.get("reachable") for m in status.get("models", []))

    wait_for("a round with the new token", round_with_new_token, 120, node)
    assert ready_pod(node, GROUP_POD, 60)["status"]["containerStatuses"][0]["restartCount"] == restarts
    print(f"the pod took the rotated token {took:.0f} s after the Secret changed; no restart")


def test_a_spec_change_rolls_out_a_new_pod(node: NodeCluster) -> None:
    old = ready_pod(node, GROUP_POD, 60)["metadata"]["name"]
    patch = {"spec": {"workload": {"device": "cpu", "pod": {"annotations": {"kvpool.dev/e2e": "rolled"}}}}}
    node.kubectl("patch", "colocatedmodels", GROUP, "-n", NS, "--type", "merge", "-p", json.dumps(patch))

    def rolled() -> dict[str, Any] | None:
        found = [p for p in pods(node, GROUP_POD) if ready(p) and p["metadata"]["name"] != old]
        return found[0] if found else None

    new = wait_for("the rollout", rolled, 900, node)
    assert new["metadata"]["annotations"]["kvpool.dev/e2e"] == "rolled"


def test_deleting_the_resource_removes_everything(node: NodeCluster) -> None:
    node.kubectl("delete", "colocatedmodels", GROUP, "-n", NS, "--wait=true")

    def gone() -> bool:
        kinds = "deployments,replicasets,services,pods"
        return not node.get(kinds, "-n", NS, "-l", GROUP_POD)["items"]

    wait_for("the group's objects garbage-collected", gone, 180, node)
    assert ready_pod(node, "app.kubernetes.io/component=operator", 30)  # the operator stays
    logs = pod_logs(node, NS, "app.kubernetes.io/component=operator")
    assert "Traceback" not in logs, logs[-4000:]  # a whole day without an unhandled error
