"""Pure builders: a ColocatedModels resource -> the manifests that run it. No I/O, no clock.

One pod per group replica, all of a pod's models on its one GPU:

    devicePlugin (default)                        dra (Kubernetes >= 1.34, NVIDIA DRA driver)
    pod                                           pod  resourceClaims: [gpu <- ResourceClaimTemplate]
    +- container "models"  nvidia.com/gpu: 1      +- container "router"                     :9000
       python -m kvpool_server.group              +- container <model a>  claims: [gpu]  :8000 :8100
       +- kvpool-router            :9000          +- container <model b>  claims: [gpu]  :8001 :8101
       +- kvpool-server <model a>  :8000 :8100
       +- kvpool-server <model b>  :8001 :8101

Each server's OpenAI API is on 8000 + i, its admin API on 8100 + i (port ``admin-i``): the chart's
NetworkPolicy lets only the operator reach those.

The device plugin hands a GPU to exactly one container, so that mode runs every model's server in
one container (the group launcher); it works on every cluster with the NVIDIA device plugin,
hence the default. DRA lets containers share one claimed device, so each model gets its own
container (own logs, own restarts) where the cluster supports it. ``workload.device: cpu`` runs
the same pod without a GPU (``--backend host``; devicePlugin mode only).

``workload.pod`` (:mod:`kvpool_operator.podspec`) is laid over the pod last: its pod-level fields
onto the pod spec, its env/envFrom/volumeMounts/resources onto every model container (``models``,
or each model's own in DRA mode; never the router), its labels and annotations onto the pod.

Services: one per model (``<group>-<model>``, ports ``http`` and ``admin``), whose EndpointSlices
the operator reads to find each pod's admin API, and one for the group (``<group>``, port 80) on the router: one
OpenAI base URL for every model of the group, chosen by the request's ``model``. Every object
carries an owner reference to the resource, so deleting the resource deletes them.
"""

from __future__ import annotations

import json
from typing import Any

from kvpool_operator.crd import GROUP, KIND, VERSION
from kvpool_operator.fields import thaw
from kvpool_operator.podspec import (
    ADMIN_TOKEN,
    ADMIN_TOKEN_DIR,
    GPU_RESOURCE,
    HF_CACHE,
    HF_HOME,
    MODELS,
    SHM,
    TMP,
    builder_mounts,
)  # fmt: skip
from kvpool_operator.policy import initial_limits
from kvpool_operator.spec import Device, GroupSpec, Mode, ModelSpec, Workload

BASE_PORT = 8000
ADMIN_BASE_PORT = 8100  # model i's admin API: ADMIN_BASE_PORT + i
ADMIN_PORT_NAME = "admin"  # the per-model Service's port the operator reads from EndpointSlices
ROUTER_PORT = 9000
SHM_HEADROOM = 1 << 30  # /dev/shm beyond the offload tiers (NCCL, vLLM's own shared memory)
MODEL_LABEL = f"{GROUP}/model"
_BACKENDS = {Device.GPU: "cuda", Device.CPU: "host"}
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


TINY_MODEL = "tiny"  # as in `kvpool_server.group --serve NAME=tiny`: the server builds its embedded model


def server_args(group: GroupSpec, model: ModelSpec, index: int, limit: int) -> list[str]:
    budget = next(b for b in group.policy.models if b.name == model.name)
    source = [] if model.model == TINY_MODEL else ["--model", model.model]
    args = [
        *source, "--served-model-name", model.name, "--host", "0.0.0.0", "--port", str(BASE_PORT + index),
        "--admin-port", str(ADMIN_BASE_PORT + index), *_token_args(group.workload),
        # no --enforce-eager: the server's default keeps CUDA graphs on with cuda (off with host)
        "--backend", _BACKENDS[group.workload.device],
        "--limit-bytes", str(limit), "--virtual-bytes", str(budget.max_bytes), "--log-json", "true",
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


def _token_args(w: Workload) -> list[str]:
    return ["--admin-token-file", f"{ADMIN_TOKEN_DIR}/token"] if w.admin_token_secret else []


def _env(w: Workload, model: bool) -> list[dict[str, Any]]:
    env: list[dict[str, Any]] = [{"name": "HOME", "value": "/tmp"}]
    if model:
        env += _hub_env(w)
    return env


def _hub_env(w: Workload) -> list[dict[str, Any]]:
    """Offline unless asked to download: a model path that is missing fails at once, naming the
    path, instead of turning into a request to the hub that an air-gapped cluster times out on."""
    hf = w.hugging_face
    env: list[dict[str, Any]] = [] if hf is not None and hf.download else [{"name": "HF_HUB_OFFLINE", "value": "1"}]
    if hf is not None:
        env.append({"name": "HF_HOME", "value": HF_HOME})
    if hf is not None and hf.token_secret:
        ref = {"name": hf.token_secret, "key": "token"}
        env.append({"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": ref}})
    return env


def _merge_env(builder: list[dict[str, Any]], user: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The user's entries last, in their order (one may refer to an earlier one as $(NAME)),
    each replacing the builder's of the same name."""
    names = {e["name"] for e in user}
    return [e for e in builder if e["name"] not in names] + user


def _probe(port: int, path: str) -> dict[str, Any]:
    return {"httpGet": {"path": path, "port": port}, "periodSeconds": 10, "failureThreshold": 3}


def _container(
    name: str, group: GroupSpec, command: list[str], ports: dict[str, int], model: bool = True
) -> dict[str, Any]:
    """Probes go to the first port: the router's where it runs (ready = every model ready)."""
    first = next(iter(ports.values()))
    return {
        "name": name,
        "image": group.workload.image,
        "command": command,
        "env": _env(group.workload, model),
        "ports": [{"name": n, "containerPort": p} for n, p in ports.items()],
        "readinessProbe": _probe(first, "/readyz"),
        "livenessProbe": _probe(first, "/livez") | {"initialDelaySeconds": 600},  # model load can be slow
        "securityContext": _security(),
        "volumeMounts": [{"name": TMP, "mountPath": "/tmp"}, {"name": SHM, "mountPath": "/dev/shm"}]
        + ([{"name": ADMIN_TOKEN, "mountPath": ADMIN_TOKEN_DIR, "readOnly": True}] if group.workload.admin_token_secret
           else []),
    }  # fmt: skip


def _model_container(c: dict[str, Any], w: Workload, resources: dict[str, Any]) -> dict[str, Any]:
    """A model server's container: the model and hub-cache mounts, then the overlay's env,
    envFrom, volumeMounts and resources (requests/limits beside the builder's GPU, which the spec
    keeps the overlay from naming)."""
    mounts = builder_mounts(w.model_volume, w.hugging_face, admin_token=bool(w.admin_token_secret))
    c["volumeMounts"] = [
        {"name": name, "mountPath": path} | ({"readOnly": True} if name in (MODELS, ADMIN_TOKEN) else {})
        for name, path in mounts.items()
    ] + thaw(w.pod.volume_mounts)
    c["env"] = _merge_env(c["env"], thaw(w.pod.env))
    if w.pod.env_from:
        c["envFrom"] = thaw(w.pod.env_from)
    for key, quantities in (("requests", w.pod.requests), ("limits", w.pod.limits)):
        if quantities:
            resources[key] = thaw(quantities) | resources.get(key, {})
    if resources:
        c["resources"] = resources
    return c


def router_args(group: GroupSpec) -> list[str]:
    upstreams = [f"--upstream={m.name}=http://127.0.0.1:{BASE_PORT + i}" for i, m in enumerate(group.models)]
    return ["--host", "0.0.0.0", "--port", str(ROUTER_PORT), "--log-json", "true", *_token_args(group.workload),
            *upstreams]  # fmt: skip


def _containers(group: GroupSpec) -> list[dict[str, Any]]:
    limits = initial_limits(group.policy)
    named = {f"http-{i}": BASE_PORT + i for i in range(len(group.models))} | {
        f"admin-{i}": ADMIN_BASE_PORT + i for i in range(len(group.models))}  # fmt: skip
    router = {"name": "router", "module": "kvpool_server.router", "args": router_args(group)}
    if group.workload.mode is Mode.DEVICE_PLUGIN:
        models = enumerate(group.models)
        servers = [{"name": m.name, "args": server_args(group, m, i, limits[m.name])} for i, m in models]
        c = _container("models", group, ["python", "-m", "kvpool_server.group"], {"http": ROUTER_PORT, **named})
        entries = json.dumps([router, *servers], separators=(",", ":"))
        c["env"].append({"name": "KVPOOL_GROUP_SERVERS", "value": entries})
        gpu = {"limits": {GPU_RESOURCE: "1"}} if group.workload.device is Device.GPU else {}  # a string: SSA
        return [_model_container(c, group.workload, gpu)]
    out = [_container("router", group, ["python", "-m", "kvpool_server.router", *router["args"]],
                      {"http": ROUTER_PORT}, model=False)]  # fmt: skip
    for i, m in enumerate(group.models):  # port names are unique within a pod, not a container
        args = server_args(group, m, i, limits[m.name])
        ports = {f"http-{i}": BASE_PORT + i, f"admin-{i}": ADMIN_BASE_PORT + i}
        c = _container(m.name, group, ["python", "-m", "kvpool_server", *args], ports)
        out.append(_model_container(c, group.workload, {"claims": [{"name": "gpu"}]}))
    return out


def _volumes(group: GroupSpec) -> list[dict[str, Any]]:
    w = group.workload
    shm = SHM_HEADROOM + w.offload_bytes * len(group.models)
    out: list[dict[str, Any]] = [{"name": TMP, "emptyDir": {}},
                                 {"name": SHM, "emptyDir": {"medium": "Memory", "sizeLimit": str(shm)}}]  # fmt: skip
    if w.model_volume is not None:
        out.append({"name": MODELS, **thaw(w.model_volume.source)})
    if w.hugging_face is not None:
        out.append({"name": HF_CACHE, **thaw(w.hugging_face.cache_volume)})
    if w.admin_token_secret:
        items = [{"key": "token", "path": "token"}]
        out.append({"name": ADMIN_TOKEN, "secret": {"secretName": w.admin_token_secret, "items": items}})
    user: list[dict[str, Any]] = thaw(w.pod.volumes)
    return out + user


def _pod_overlay(pod: dict[str, Any], w: Workload) -> dict[str, Any]:
    """The overlay's pod-level fields, each only where given (an empty list is no field)."""
    o = w.pod
    for key, value in (
        ("nodeSelector", o.node_selector), ("tolerations", o.tolerations), ("affinity", o.affinity),
        ("imagePullSecrets", o.image_pull_secrets), ("priorityClassName", o.priority_class_name),
        ("serviceAccountName", o.service_account_name),
    ):  # fmt: skip
        if value:
            pod[key] = thaw(value)
    return pod


def _template_meta(name: str, w: Workload) -> dict[str, Any]:
    meta: dict[str, Any] = {"labels": dict(w.pod.labels) | labels(name)}  # the spec refused clashing keys
    if w.pod.annotations:
        meta["annotations"] = dict(w.pod.annotations)
    return meta


def deployment(body: dict[str, Any], group: GroupSpec) -> dict[str, Any]:
    name = body["metadata"]["name"]
    pod: dict[str, Any] = {
        "securityContext": {"runAsNonRoot": True, "runAsUser": 1000, "runAsGroup": 1000, "fsGroup": 1000,
                            "seccompProfile": {"type": "RuntimeDefault"}},
        "containers": _containers(group),
        "volumes": _volumes(group),
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
            "template": {"metadata": _template_meta(name, group.workload), "spec": _pod_overlay(pod, group.workload)},
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
        ports = [
            {"name": "http", "port": 80, "targetPort": BASE_PORT + i, "protocol": "TCP"},
            {"name": ADMIN_PORT_NAME, "port": ADMIN_BASE_PORT, "targetPort": ADMIN_BASE_PORT + i, "protocol": "TCP"},
        ]
        spec = {"selector": selector, "ports": ports}
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
