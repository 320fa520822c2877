"""``make cluster``: the chart on a real single-node cluster on this machine, as the e2e test runs it.

Builds the images (``tools/k8s/images.sh``), starts the cluster (``tests/k8s/node.py``), runs
``helm install`` of ``helm/kvpool`` with a ``device: cpu`` group of two tiny models (or your own
values file), prints how to reach it, and tears everything down on Ctrl-C. Needs root.

    make cluster                       # the demo group
    make cluster ARGS="--values my.yaml"
"""

from __future__ import annotations

import argparse
import json
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

from tests.k8s.cluster import BIN
from tests.k8s.node import GATEWAY, NodeCluster, build_images, start_node_cluster

CHART = Path(__file__).parents[2] / "helm" / "kvpool"
NAMESPACE = "kvpool-system"


def demo_values(node: NodeCluster, group: str = "pair") -> dict[str, Any]:
    """Two tiny models on the CPU sharing a 256 MiB KV budget; the operator given the API server's
    address (this node has no kube-proxy to route the ``kubernetes`` Service's ClusterIP)."""
    port = node.api.url.rsplit(":", 1)[1]
    model = {"model": "tiny", "minBytes": "32Mi", "maxBytes": "224Mi"}
    return {
        "operator": {"env": [{"name": "KUBERNETES_SERVICE_HOST", "value": GATEWAY},
                             {"name": "KUBERNETES_SERVICE_PORT", "value": port}],
                     "resources": {"requests": {"cpu": "50m", "memory": "128Mi"}}},
        "groups": [{
            "name": group, "gpuMemoryBudgetBytes": "256Mi",
            "rebalance": {"intervalSeconds": 2, "hysteresisBytes": "8Mi", "maxStepBytes": "64Mi"},
            "workload": {"device": "cpu"},
            "models": [{"name": "a", **model}, {"name": "b", **model}],
        }],
    }  # fmt: skip


def helm_install(node: NodeCluster, values: dict[str, Any], extra: tuple[str, ...] = ()) -> None:
    path = node.api.dir / "values.yaml"
    path.write_text(yaml.safe_dump(values))
    cmd = [str(BIN / "helm"), "--kubeconfig", str(node.api.kubeconfig()), "install", "kv", str(CHART),
           "-n", NAMESPACE, "--create-namespace", "-f", str(path), *extra]  # fmt: skip
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    if out.returncode != 0:
        raise RuntimeError(f"helm install failed: {out.stderr}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--values", type=Path, help="a values file for helm install (default: the demo group)")
    parser.add_argument("--dir", type=Path, help="where the cluster keeps its state (default: a new temp dir)")
    args = parser.parse_args(argv)
    if args.values is not None and not args.values.is_file():
        parser.error(f"--values: {args.values} is not a file")
    print("building the images (cached after the first time) ...", flush=True)
    images = build_images()
    d = args.dir or Path(tempfile.mkdtemp(prefix="kvpool-node-"))
    node = start_node_cluster(d, images)
    try:
        helm_install(node, demo_values(node), ("-f", str(args.values)) if args.values else ())
        kubeconfig = node.api.kubeconfig()
        print(json.dumps({"kubeconfig": str(kubeconfig), "namespace": NAMESPACE}), flush=True)
        print(f"\n  export KUBECONFIG={kubeconfig}\n  {BIN}/kubectl get colocatedmodels,pods -n {NAMESPACE} -o wide\n"
              "  the group's OpenAI endpoint: http://<the group pod's IP>:9000/v1\n\nCtrl-C stops the cluster.",
              flush=True)  # fmt: skip
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        pass
    finally:
        node.stop()
        left = node.leftovers()
        print("stopped" + (f"; left behind: {left}" if left else ", nothing left behind"), flush=True)
        if args.dir is None and not left:  # our own temporary state: nothing in it is running or mounted
            shutil.rmtree(d)


if __name__ == "__main__":
    main()
