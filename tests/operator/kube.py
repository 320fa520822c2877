"""What the operator's tests against a real API server share: the namespace, the group's
resource, and local kvpool-servers registered as a group's endpoints."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from kubernetes import client as k8s
from kvpool_operator.crd import GROUP, PLURAL, VERSION

from tests.server.conftest import Server, free_port

MiB = 1 << 20
NS = "kvtest"
LIVENESS = f"http://127.0.0.1:{free_port()}/healthz"  #: the operator's probe (kopf.on.probe answers there)
OPERATOR = ["run", "--standalone", "--namespace", NS, "-m", "kvpool_operator.handlers", "--verbose",
            "--liveness", LIVENESS]  # fmt: skip


def wait_for(check: Callable[[], Any], timeout: float = 60, what: str = "condition") -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            value = check()
        except k8s.ApiException as e:
            if e.status != 404:
                raise
            value = None
        if value:
            return value
        time.sleep(0.3)
    raise AssertionError(f"timed out waiting for {what}")


def group_body(name: str, models: list[dict[str, Any]], **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": f"{GROUP}/{VERSION}", "kind": "ColocatedModels", "metadata": {"name": name},
        "spec": {"gpuMemoryBudgetBytes": "256Mi", "models": models, **spec},
    }  # fmt: skip


def create(api: k8s.ApiClient, body: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = k8s.CustomObjectsApi(api).create_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, body)
    return out


def get(api: k8s.ApiClient, name: str) -> dict[str, Any]:
    out: dict[str, Any] = k8s.CustomObjectsApi(api).get_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, name)
    return out


def events(api: k8s.ApiClient, name: str) -> list[Any]:
    return [e for e in k8s.CoreV1Api(api).list_namespaced_event(NS).items if e.involved_object.name == name]


TWO = [
    {"name": "a", "model": "/models/a", "minBytes": "32Mi", "maxBytes": "224Mi"},
    {"name": "b", "model": "/models/b", "minBytes": "32Mi", "maxBytes": "224Mi"},
]


def register(api: k8s.ApiClient, group: str, model: str, server: Server) -> None:
    """What the endpoint-slice controller does for a pod: here the 'pod' is a local server."""
    port, admin_port = (int(url.rsplit(":", 1)[1]) for url in (server.url, server.admin_url))
    body = {
        "apiVersion": "discovery.k8s.io/v1beta1", "kind": "EndpointSlice", "addressType": "IPv4",
        "metadata": {"name": f"{group}-{model}-local", "labels": {
            "kubernetes.io/service-name": f"{group}-{model}", f"{GROUP}/group": group, f"{GROUP}/model": model,
            "endpointslice.kubernetes.io/managed-by": "kvpool-tests"}},
        "ports": [{"name": "http", "port": port, "protocol": "TCP"}, {"name": "admin", "port": admin_port}],
        "endpoints": [{"addresses": ["127.0.0.1"], "conditions": {"ready": True}}],
    }  # fmt: skip
    k8s.CustomObjectsApi(api).create_namespaced_custom_object("discovery.k8s.io", "v1beta1", NS, "endpointslices", body)
