"""The operator's least privileges, as data: the chart renders this ClusterRole, and a test runs
the operator as a user bound to exactly it (allowed and denied verbs both checked)."""

from __future__ import annotations

from typing import Any

from kvpool_operator.crd import GROUP, PLURAL


def rules() -> list[dict[str, Any]]:
    def rule(group: str, resources: list[str], verbs: list[str]) -> dict[str, Any]:
        return {"apiGroups": [group], "resources": resources, "verbs": verbs}

    workload = ["get", "list", "watch", "create", "patch", "update"]  # server-side apply; GC deletes
    return [
        rule(GROUP, [PLURAL], ["get", "list", "watch", "patch"]),
        rule(GROUP, [f"{PLURAL}/status"], ["get", "patch", "update"]),
        rule("apps", ["deployments"], workload),
        rule("", ["services"], workload),
        rule("resource.k8s.io", ["resourceclaimtemplates"], workload),  # dra mode
        rule("discovery.k8s.io", ["endpointslices"], ["get", "list", "watch"]),  # where the servers are
        rule("", ["secrets"], ["get"]),  # the admin token named in the spec
        rule("", ["events"], ["create", "patch"]),
        rule("events.k8s.io", ["events"], ["create", "patch"]),
        # kopf itself: resource discovery, namespaces (cluster-wide), peering between replicas
        rule("apiextensions.k8s.io", ["customresourcedefinitions"], ["list", "watch"]),
        rule("", ["namespaces"], ["list", "watch"]),
        rule("kopf.dev", ["clusterkopfpeerings"], ["get", "list", "watch", "patch"]),
    ]


def cluster_role(name: str = "kvpool-operator") -> dict[str, Any]:
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRole",
        "metadata": {
            "name": name,
            "labels": {"app.kubernetes.io/name": "kvpool", "app.kubernetes.io/component": "operator"},
        },
        "rules": rules(),
    }
