"""The single-node cluster's own promise: whatever happens to it, stopping it leaves nothing on the
host -- not even when the kubelet and containerd die under running pods (a killed shim would leave
its container running, orphaned, in its cgroup)."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from pathlib import Path

import pytest

from tests.k8s.node import NodeCluster, build_images, start_node_cluster

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(1800)]

POD = {
    "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "sleeper", "namespace": "default"},
    "spec": {"containers": [{"name": "s", "image": "ghcr.io/kvpool/kvpool-operator:0.1.0",
                             "imagePullPolicy": "Never", "command": ["python", "-c", "import time; time.sleep(3600)"],
                             "securityContext": {"runAsUser": 1000, "runAsNonRoot": True}}]},
}  # fmt: skip


def running(node: NodeCluster) -> bool:
    out = node.kubectl("get", "pod", "sleeper", "-o", "json", check=False)
    return out.returncode == 0 and json.loads(out.stdout)["status"].get("phase") == "Running"


def test_a_node_whose_kubelet_and_containerd_died_under_a_pod_still_stops_clean() -> None:
    if os.geteuid() != 0:
        pytest.skip("a node needs root (containerd, the kubelet, a bridge): run make test as root")
    images = [p for p in build_images() if "pause" in p.name or "operator" in p.name]
    d = Path(tempfile.mkdtemp(prefix="kvpool-node-"))
    node = start_node_cluster(d, images)
    try:
        manifest = d / "pod.json"
        manifest.write_text(json.dumps(POD))
        node.kubectl("apply", "-f", str(manifest))
        deadline = time.monotonic() + 120
        while not running(node):
            assert time.monotonic() < deadline, node.logs()
            time.sleep(1)
        for p in node.procs:  # the kubelet and containerd crash; the pod's processes live on
            if "kubelet" in p.args[0] or "containerd" in p.args[0]:
                p.kill()
                p.wait()
        assert any(s.startswith("process") for s in node.leftovers())  # the sleeper is still there
    finally:
        node.stop()
    assert node.leftovers() == []
    shutil.rmtree(d)
