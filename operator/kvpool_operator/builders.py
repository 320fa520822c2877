"""Pure builders: a ColocatedModels resource -> the manifests that run it. No I/O, no clock.

One pod per group replica, all of a pod's models on its one GPU:

    devicePlugin (default)                        dra (Kubernetes >= 1.34, NVIDIA DRA driver)
    pod                                           pod  resourceClaims: [gpu <- ResourceClaimTemplate]
    +- container "models"  nvidia.com/gpu: 1      +- container "router"                   :9000
       python -m kvpool_server.group              +- container <model a>  claims: [gpu]  :8000
       +- kvpool-router            :9000          +- container <model b>  claims: [gpu]  :8001
       +- kvpool-server <model a>  :8000
       +- kvpool-server <model b>  :8001

The device plugin hands a GPU to exactly one container, so that mode runs every model's server in
one container (the group launcher); it works on every cluster with the NVIDIA device plugin,
hence the default. DRA lets containers share one claimed device, so each model gets its own
container (own logs, own restarts) where the cluster supports it.

Services: one per model (``<group>-<model>``, port ``http``), whose EndpointSlices the operator
reads to find each pod's server, and one for the group (``<group>``, port 80) on the router: one
OpenAI base URL for every model of the group, chosen by the request's ``model``. Every object
carries an owner reference to the resource, so deleting the resource deletes them.
"""

from __future__ import annotations

import json
from typing import Any

from kvpool_operator.crd import GROUP, KIND, VERSION
from kvpool_operator.policy import initial_limits
from kvpool_operator.spec import GroupSpec, Mode, ModelSpec

BASE_PORT = 8000
ROUTER_PORT = 9000
SHM_HEADROOM = 1 << 30  # /dev/shm beyond the offload tiers (NCCL, vLLM's own shared memory)
MODEL_LABEL = f"{GROUP}/model"
GROUP_LABEL = f"{GROUP}/group"


def labels(name: str, model: str | None = None) -> dict[str, str]:
    out = {
        "app.kubernetes.io/name": "kvpool",
        "app.kubernetes.io/instance": name,
        "app.kubernetes.io/component": "model-server",
        "app.kubernetes.io/managed-by": "kvpool-operator",
        GROUP_LABEL: name,
    }
    return out | ({MODEL_LABEL: model} if model else {})


def owner_reference(body: dict[str, Any]) -> dict[str, Any]:
    meta = body["metadata"]
    return {
        "apiVersion": f"{GROUP}/{VERSION}", "kind": KIND, "name": meta["name"], "uid": meta["uid"],
        "controller": True, "blockOwnerDeletion": True,
    }  # fmt: skip


def _meta(body: dict[str, Any], name: str, model: str | None = None) -> dict[str, Any]:
    return {
        "name": name,
        "namespace": body["metadata"]["namespace"],
        "labels": labels(body["metadata"]["name"], model),
        "ownerReferences": [owner_reference(body)],
    }


def server_args(group: GroupSpec, model: ModelSpec, port: int, limit: int) -> list[str]:
    budget = next(b for b in group.policy.models if b.name == model.name)
    args = [
        "--model", model.model, "--served-model-name", model.name, "--host", "0.0.0.0", "--port", str(port),
        "--backend", "cuda", "--limit-bytes", str(limit), "--virtual-bytes", str(budget.max_bytes), "--log-json",
        # the pod's pools share one ledger in its /dev/shm volume: no limit the operator sets can
        # make them map more than the group's budget together
        "--ledger-bytes", str(group.policy.budget_bytes),
    ]  # fmt: skip
    if group.workload.offload_bytes:
        args += ["--offload-bytes", str(group.workload.offload_bytes), "--offload-dir", "/dev/shm"]
    return args + list(model.args)


def _security() -> dict[str, Any]:
    return {
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "capabilities": {"drop": ["ALL"]},
    }


def _env(group: GroupSpec) -> list[dict[str, Any]]:
    env: list[dict[str, Any]] = [{"name": "HOME", "value": "/tmp"}, {"name": "HF_HUB_OFFLINE", "value": "1"}]
    if group.workload.admin_token_secret:
        ref = {"name": group.workload.admin_token_secret, "key": "token"}
        env.append({"name": "KVPOOL_ADMIN_TOKEN", "valueFrom": {"secretKeyRef": ref}})
    return env


def _probe(port: int, path: str) -> dict[str, Any]:
    return {"httpGet": {"path": path, "port": port}, "periodSeconds": 10, "failureThreshold": 3}


def _container(name: str, group: GroupSpec, command: list[str], ports: dict[str, int]) -> dict[str, Any]:
    """Probes go to the first port: the router's where it runs (ready = every model ready)."""
    first = next(iter(ports.values()))
    return {
        "name": name,
        "image": group.workload.image,
        "command": command,
        "env": _env(group),
        "ports": [{"name": n, "containerPort": p} for n, p in ports.items()],
        "readinessProbe": _probe(first, "/readyz"),
        "livenessProbe": _probe(first, "/livez") | {"initialDelaySeconds": 600},  # model load can be slow
        "securityContext": _security(),
        "volumeMounts": [{"name": "tmp", "mountPath": "/tmp"}, {"name": "shm", "mountPath": "/dev/shm"}],
    }


def router_args(group: GroupSpec) -> list[str]:
    upstreams = [f"--upstream={m.name}=http://127.0.0.1:{BASE_PORT + i}" for i, m in enumerate(group.models)]
    return ["--host", "0.0.0.0", "--port", str(ROUTER_PORT), "--log-json", "true", *upstreams]


def _containers(group: GroupSpec) -> list[dict[str, Any]]:
    limits = initial_limits(group.policy)
    ports = {m.name: BASE_PORT + i for i, m in enumerate(group.models)}
    named = {f"http-{i}": p for i, p in enumerate(ports.values())}
    router = {"name": "router", "module": "kvpool_server.router", "args": router_args(group)}
    if group.workload.mode is Mode.DEVICE_PLUGIN:
        servers = [{"name": m.name, "args": server_args(group, m, ports[m.name], limits[m.name])} for m in group.models]
        c = _container("models", group, ["python", "-m", "kvpool_server.group"], {"http": ROUTER_PORT, **named})
        entries = json.dumps([router, *servers], separators=(",", ":"))
        c["env"].append({"name": "KVPOOL_GROUP_SERVERS", "value": entries})
        c["resources"] = {"limits": {"nvidia.com/gpu": "1"}}  # a quantity: a string for server-side apply
        return [c]
    out = [_container("router", group, ["python", "-m", "kvpool_server.router", *router["args"]],
                      {"http": ROUTER_PORT})]  # fmt: skip
    for i, m in enumerate(group.models):  # port names are unique within a pod, not a container
        args = server_args(group, m, ports[m.name], limits[m.name])
        c = _container(m.name, group, ["python", "-m", "kvpool_server", *args], {f"http-{i}": ports[m.name]})
        c["resources"] = {"claims": [{"name": "gpu"}]}
        out.append(c)
    return out


def deployment(body: dict[str, Any], group: GroupSpec) -> dict[str, Any]:
    name = body["metadata"]["name"]
    shm = SHM_HEADROOM + group.workload.offload_bytes * len(group.models)
    pod: dict[str, Any] = {
        "securityContext": {"runAsNonRoot": True, "runAsUser": 1000, "runAsGroup": 1000, "fsGroup": 1000,
                            "seccompProfile": {"type": "RuntimeDefault"}},
        "containers": _containers(group),
        "volumes": [{"name": "tmp", "emptyDir": {}},
                    {"name": "shm", "emptyDir": {"medium": "Memory", "sizeLimit": str(shm)}}],
        "terminationGracePeriodSeconds": 60,
    }  # fmt: skip
    if group.workload.mode is Mode.DRA:
        pod["resourceClaims"] = [{"name": "gpu", "resourceClaimTemplateName": f"{name}-gpu"}]
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": _meta(body, name),
        "spec": {
            "replicas": group.workload.replicas,
            "selector": {"matchLabels": {GROUP_LABEL: name}},
            "strategy": {"type": "Recreate"},  # a new pod needs the GPU the old one holds
            "template": {"metadata": {"labels": labels(name)}, "spec": pod},
        },
    }


def resource_claim_template(body: dict[str, Any], group: GroupSpec) -> dict[str, Any]:
    name = body["metadata"]["name"]
    request = {"name": "gpu", "exactly": {"deviceClassName": group.workload.device_class, "count": 1}}
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": _meta(body, f"{name}-gpu"),
        "spec": {"spec": {"devices": {"requests": [request]}}},
    }


def services(body: dict[str, Any], group: GroupSpec) -> list[dict[str, Any]]:
    name = body["metadata"]["name"]
    selector = {GROUP_LABEL: name}
    out = []
    for i, m in enumerate(group.models):
        port = {"name": "http", "port": 80, "targetPort": BASE_PORT + i, "protocol": "TCP"}
        spec = {"selector": selector, "ports": [port]}
        out.append({"apiVersion": "v1", "kind": "Service", "metadata": _meta(body, f"{name}-{m.name}", m.name),
                    "spec": spec})  # fmt: skip
    port = {"name": "http", "port": 80, "targetPort": ROUTER_PORT, "protocol": "TCP"}
    out.append({"apiVersion": "v1", "kind": "Service", "metadata": _meta(body, name),
                "spec": {"selector": selector, "ports": [port]}})  # fmt: skip
    return out


def manifests(body: dict[str, Any], group: GroupSpec) -> list[dict[str, Any]]:
    """Everything the group needs, in apply order."""
    out = services(body, group)
    if group.workload.mode is Mode.DRA:
        out.append(resource_claim_template(body, group))
    return [*out, deployment(body, group)]
