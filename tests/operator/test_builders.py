"""The builders: exact manifests for representative specs, both GPU modes, owner references
everywhere, and every manifest valid for Kubernetes 1.34 and 1.37 (offline schemas, strict)."""

from __future__ import annotations

import json
from typing import Any

import kubernetes_validate
import pytest
from kvpool_operator.builders import deployment, manifests, services
from kvpool_operator.policy import initial_limits
from kvpool_operator.spec import parse_group

GiB = 1 << 30
BODY = {"metadata": {"name": "pair", "namespace": "ml", "uid": "u-1"}}
OWNER = {"apiVersion": "kvpool.dev/v1alpha1", "kind": "ColocatedModels", "name": "pair", "uid": "u-1",
         "controller": True, "blockOwnerDeletion": True}  # fmt: skip


def spec(**workload: Any) -> dict[str, Any]:
    return {
        "gpuMemoryBudgetBytes": "40Gi",
        "models": [
            {"name": "llama", "model": "/models/llama", "minBytes": "4Gi", "maxBytes": "30Gi", "weight": 3},
            {"name": "qwen", "model": "/models/qwen", "minBytes": "4Gi", "maxBytes": "30Gi", "args": ["--seed", "1"]},
        ],
        "workload": workload,
    }


def labels(model: str | None = None) -> dict[str, str]:
    out = {"app.kubernetes.io/name": "kvpool", "app.kubernetes.io/instance": "pair",
           "app.kubernetes.io/component": "model-server", "app.kubernetes.io/managed-by": "kvpool-operator",
           "kvpool.dev/group": "pair"}  # fmt: skip
    return out | ({"kvpool.dev/model": model} if model else {})


def test_initial_limits_give_every_minimum_and_split_the_rest_by_weight() -> None:
    limits = initial_limits(parse_group(spec()).policy)
    assert limits == {"llama": 4 * GiB + 24 * GiB, "qwen": 4 * GiB + 8 * GiB}
    assert sum(limits.values()) <= 40 * GiB


def test_the_device_plugin_deployment_is_exactly_this() -> None:
    dep = deployment(BODY, parse_group(spec(adminTokenSecret="pair-admin", offloadBytes="2Gi")))
    (c,) = dep["spec"]["template"]["spec"]["containers"]
    servers = json.loads(next(e["value"] for e in c["env"] if e["name"] == "KVPOOL_GROUP_SERVERS"))
    assert servers == [
        {"name": "router", "module": "kvpool_server.router",
         "args": ["--host", "0.0.0.0", "--port", "9000", "--log-json", "true", "--upstream=llama=http://127.0.0.1:8000",
                  "--upstream=qwen=http://127.0.0.1:8001"]},
        {"name": "llama", "args": ["--model", "/models/llama", "--served-model-name", "llama", "--host", "0.0.0.0",
                                   "--port", "8000", "--backend", "cuda", "--limit-bytes", str(28 * GiB),
                                   "--virtual-bytes", str(30 * GiB), "--log-json", "--ledger-bytes", str(40 * GiB),
                                   "--offload-bytes", str(2 * GiB), "--offload-dir", "/dev/shm"]},
        {"name": "qwen", "args": ["--model", "/models/qwen", "--served-model-name", "qwen", "--host", "0.0.0.0",
                                  "--port", "8001", "--backend", "cuda", "--limit-bytes", str(12 * GiB),
                                  "--virtual-bytes", str(30 * GiB), "--log-json", "--ledger-bytes", str(40 * GiB),
                                  "--offload-bytes", str(2 * GiB), "--offload-dir", "/dev/shm", "--seed", "1"]},
    ]  # fmt: skip
    c["env"] = [e for e in c["env"] if e["name"] != "KVPOOL_GROUP_SERVERS"]
    probe = {"periodSeconds": 10, "failureThreshold": 3}
    assert dep == {
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "pair", "namespace": "ml", "labels": labels(), "ownerReferences": [OWNER]},
        "spec": {
            "replicas": 1, "selector": {"matchLabels": {"kvpool.dev/group": "pair"}}, "strategy": {"type": "Recreate"},
            "template": {"metadata": {"labels": labels()}, "spec": {
                "securityContext": {"runAsNonRoot": True, "runAsUser": 1000, "runAsGroup": 1000, "fsGroup": 1000,
                                    "seccompProfile": {"type": "RuntimeDefault"}},
                "containers": [{
                    "name": "models", "image": "ghcr.io/kvpool/kvpool:0.1.0",
                    "command": ["python", "-m", "kvpool_server.group"],
                    "env": [{"name": "HOME", "value": "/tmp"}, {"name": "HF_HUB_OFFLINE", "value": "1"},
                            {"name": "KVPOOL_ADMIN_TOKEN",
                             "valueFrom": {"secretKeyRef": {"name": "pair-admin", "key": "token"}}}],
                    "ports": [{"name": "http", "containerPort": 9000}, {"name": "http-0", "containerPort": 8000},
                              {"name": "http-1", "containerPort": 8001}],
                    "readinessProbe": {"httpGet": {"path": "/readyz", "port": 9000}, **probe},
                    "livenessProbe": {"httpGet": {"path": "/livez", "port": 9000}, **probe, "initialDelaySeconds": 600},
                    "securityContext": {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
                                        "capabilities": {"drop": ["ALL"]}},
                    "volumeMounts": [{"name": "tmp", "mountPath": "/tmp"}, {"name": "shm", "mountPath": "/dev/shm"}],
                    "resources": {"limits": {"nvidia.com/gpu": "1"}},
                }],
                "volumes": [{"name": "tmp", "emptyDir": {}},
                            {"name": "shm", "emptyDir": {"medium": "Memory", "sizeLimit": str(5 * GiB)}}],
                "terminationGracePeriodSeconds": 60,
            }},
        },
    }  # fmt: skip


def test_dra_mode_gives_each_model_a_container_sharing_one_claim() -> None:
    objs = manifests(BODY, parse_group(spec(mode="dra", replicas=2)))
    assert [o["kind"] for o in objs] == ["Service", "Service", "Service", "ResourceClaimTemplate", "Deployment"]
    rct, dep = objs[3], objs[4]
    assert rct["metadata"]["name"] == "pair-gpu"
    assert rct["spec"] == {"spec": {"devices": {"requests": [
        {"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com", "count": 1}}]}}}  # fmt: skip
    pod = dep["spec"]["template"]["spec"]
    assert pod["resourceClaims"] == [{"name": "gpu", "resourceClaimTemplateName": "pair-gpu"}]
    assert [(c["name"], c.get("resources"), c["command"][:3]) for c in pod["containers"]] == [
        ("router", None, ["python", "-m", "kvpool_server.router"]),  # no GPU: it imports neither torch nor vLLM
        ("llama", {"claims": [{"name": "gpu"}]}, ["python", "-m", "kvpool_server"]),
        ("qwen", {"claims": [{"name": "gpu"}]}, ["python", "-m", "kvpool_server"]),
    ]
    names = [p["name"] for c in pod["containers"] for p in c["ports"]]
    assert names == ["http", "http-0", "http-1"]  # unique within the pod
    assert pod["containers"][0]["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": 9000}
    assert dep["spec"]["replicas"] == 2


def test_services_one_per_model_and_one_for_the_group_on_its_router() -> None:
    svcs = services(BODY, parse_group(spec()))
    seen = [(s["metadata"]["name"], s["metadata"]["labels"].get("kvpool.dev/model"), s["spec"]["ports"]) for s in svcs]
    assert seen == [
        ("pair-llama", "llama", [{"name": "http", "port": 80, "targetPort": 8000, "protocol": "TCP"}]),
        ("pair-qwen", "qwen", [{"name": "http", "port": 80, "targetPort": 8001, "protocol": "TCP"}]),
        ("pair", None, [{"name": "http", "port": 80, "targetPort": 9000, "protocol": "TCP"}]),  # the router
    ]  # fmt: skip
    assert all(s["spec"]["selector"] == {"kvpool.dev/group": "pair"} for s in svcs)
    assert all(s["metadata"]["ownerReferences"] == [OWNER] for s in svcs)


@pytest.mark.parametrize("version", ["1.34", "1.37"])
@pytest.mark.parametrize("mode", ["devicePlugin", "dra"])
def test_every_manifest_is_valid_for_current_kubernetes(version: str, mode: str) -> None:
    for obj in manifests(BODY, parse_group(spec(mode=mode, offloadBytes="1Gi"))):
        kubernetes_validate.validate(obj, version, strict=True)
