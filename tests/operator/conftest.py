"""Fixtures of the operator's tests against a real API server: the namespace with its CRD and
admin-token Secret, the operator in-process (kopf's runner), two real kvpool-servers."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from kubernetes import client as k8s
from kubernetes import config as k8s_config
from kvpool_operator.crd import GROUP, PLURAL, build_crd

from tests.k8s.cluster import Cluster
from tests.operator.kube import NS, OPERATOR, wait_for
from tests.server.conftest import TOKEN as ADMIN_TOKEN
from tests.server.conftest import Server, start_server, stop_server


@pytest.fixture(scope="session")
def admin(cluster: Cluster) -> k8s.ApiClient:
    api = k8s_config.new_client_from_config(config_file=str(cluster.kubeconfig()))
    ext = k8s.ApiextensionsV1Api(api)
    try:
        ext.create_custom_resource_definition(build_crd())
    except k8s.ApiException as e:  # the chart's install test put the same CRD (a test keeps them equal)
        if e.status != 409:
            raise
    wait_for(lambda: any(c.type == "Established" and c.status == "True"
                         for c in ext.read_custom_resource_definition(f"{PLURAL}.{GROUP}").status.conditions or []),
             what="the CRD")  # fmt: skip
    k8s.CoreV1Api(api).create_namespace({"metadata": {"name": NS}})
    k8s.CoreV1Api(api).create_namespaced_secret(
        NS, {"metadata": {"name": "admin-token"}, "stringData": {"token": ADMIN_TOKEN}}
    )
    return api


@pytest.fixture
def operator(cluster: Cluster, admin: k8s.ApiClient, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    import kopf.testing

    monkeypatch.setenv("KUBECONFIG", str(cluster.kubeconfig()))
    with kopf.testing.KopfRunner(OPERATOR) as runner:
        yield
    assert runner.exception is None, runner.output[-3000:]
    assert ADMIN_TOKEN not in runner.output, "the operator logged the admin token"


@pytest.fixture(scope="session")
def servers(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Server]]:
    out = {
        m: start_server(tiny_model, tmp_path_factory.mktemp(f"srv-{m}"), limit="128Mi", virtual="512Mi") for m in "ab"
    }
    yield out
    for s in out.values():
        stop_server(s)
