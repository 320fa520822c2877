"""The Helm chart, with the real Helm 4 binary: lint, render (default and representative values),
offline validation for the oldest and newest Kubernetes supported, the values schema's errors,
one source for the CRD and the RBAC rules, and a real install against the session's API server."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from kvpool_operator.crd import build_crd, values_schema_groups
from kvpool_operator.rbac import rules

from tests.k8s.cluster import BIN, Cluster

CHART = Path(__file__).parents[2] / "helm" / "kvpool"
VALUES = Path(__file__).parent / "values-representative.yaml"
MONITORING = ["--api-versions", "monitoring.coreos.com/v1"]
CUSTOM = ("kvpool.dev/", "monitoring.coreos.com/", "kopf.dev/")


def helm(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(BIN / "helm"), *args], capture_output=True, text=True, check=check, timeout=120)


def render(*args: str) -> list[dict[str, Any]]:
    out = helm("template", "kv", str(CHART), "--namespace", "kvpool-system", *args).stdout
    return [d for d in yaml.safe_load_all(out) if d]


def test_lint_is_clean_with_default_and_representative_values() -> None:
    helm("lint", "--strict", str(CHART))
    helm("lint", "--strict", str(CHART), "-f", str(VALUES))  # helm lint has no --api-versions


@pytest.mark.parametrize("version", ["1.25", "1.37"])
@pytest.mark.parametrize("values", [[], ["-f", str(VALUES)]], ids=["default", "representative"])
def test_rendered_manifests_are_valid_kubernetes(version: str, values: list[str]) -> None:
    docs = render(*values, *MONITORING)
    kinds = {d["kind"] for d in docs}
    assert {"Deployment", "ClusterRole", "ServiceAccount", "ServiceMonitor", "PrometheusRule", "ConfigMap"} <= kinds
    for d in docs:
        if not d["apiVersion"].startswith(CUSTOM):  # custom resources: dry-run against the API server
            kubernetes_validate.validate(d, version, strict=True)


def test_representative_values_render_groups_and_secure_pods() -> None:
    docs = render("-f", str(VALUES), *MONITORING)
    groups = {d["metadata"]["name"]: d for d in docs if d["kind"] == "ColocatedModels"}
    assert set(groups) == {"pair", "trio"}
    assert groups["pair"]["spec"]["workload"] == {
        "image": "registry.example.com/kvpool:0.1.0", "adminTokenSecret": "kvpool-admin", "mode": "devicePlugin",
        "offloadBytes": "2Gi", "replicas": 2,
    }  # fmt: skip
    assert not [d for d in docs if d["kind"] == "Secret"]  # an existing Secret was named
    (op,) = [d for d in docs if d["kind"] == "Deployment"]
    pod = op["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    assert "--standalone" not in c["args"]  # two replicas: kopf peering
    assert "--namespace=ml" in c["args"]
    assert [d["metadata"]["name"] for d in docs if d["kind"] == "ClusterKopfPeering"] == ["kvpool-operator"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert c["securityContext"] == {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
                                    "capabilities": {"drop": ["ALL"]}}  # fmt: skip
    for d in docs:
        labels = d["metadata"].get("labels", {})
        assert labels.get("app.kubernetes.io/name") == "kvpool", d["kind"]
        assert labels.get("app.kubernetes.io/instance") == "kv", d["kind"]


def test_a_cpu_group_runs_the_cpu_image_unless_its_workload_names_one() -> None:
    model = {"name": "a", "model": "/models/a", "minBytes": 0, "maxBytes": "1Gi"}
    groups = [
        {"name": "gpu", "gpuMemoryBudgetBytes": "1Gi", "models": [model]},
        {"name": "cpu", "gpuMemoryBudgetBytes": "1Gi", "workload": {"device": "cpu"}, "models": [model]},
        {"name": "own", "gpuMemoryBudgetBytes": "1Gi", "workload": {"device": "cpu", "image": "me/kvpool:dev",
                                                                    "pod": {"nodeSelector": {"pool": "cpu"}}},
         "models": [model]},
    ]  # fmt: skip
    docs = render("--set", "image.tag=1.2.3", "--set-json", f"groups={json.dumps(groups)}")
    workloads = {d["metadata"]["name"]: d["spec"]["workload"] for d in docs if d["kind"] == "ColocatedModels"}
    images = {name: w["image"] for name, w in workloads.items()}
    repo = "ghcr.io/kvpool/kvpool"
    assert images == {"gpu": f"{repo}:1.2.3", "cpu": f"{repo}:1.2.3-cpu", "own": "me/kvpool:dev"}
    assert workloads["own"] == {"image": "me/kvpool:dev", "adminTokenSecret": "kv-kvpool-admin-token",
                                "device": "cpu", "pod": {"nodeSelector": {"pool": "cpu"}}}  # fmt: skip


def test_monitoring_objects_need_the_prometheus_operator() -> None:
    kinds = {d["kind"] for d in render()}
    assert "ServiceMonitor" not in kinds
    assert "PrometheusRule" not in kinds


def selects(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    """A LabelSelector of matchLabels alone (what the chart writes) against a pod's labels."""
    assert set(selector) <= {"matchLabels"}, selector
    return all(labels.get(k) == v for k, v in selector.get("matchLabels", {}).items())


def test_the_network_policy_lets_only_the_operators_pods_reach_the_admin_ports() -> None:
    from kvpool_operator.builders import deployment
    from kvpool_operator.spec import MAX_MODELS, parse_group

    docs = render()
    (policy,) = [d for d in docs if d["kind"] == "NetworkPolicy"]
    (op,) = [d for d in docs if d["kind"] == "Deployment"]
    operator_pod = op["spec"]["template"]["metadata"]["labels"]
    models = [{"name": f"m{i}", "model": "tiny", "minBytes": 0, "maxBytes": "1Gi"} for i in range(MAX_MODELS)]
    body = {"metadata": {"name": "g", "namespace": "kvpool-system", "uid": "u"}}
    group = deployment(body, parse_group({"gpuMemoryBudgetBytes": "8Gi", "models": models}))["spec"]["template"]
    ports = {p["name"]: p["containerPort"] for c in group["spec"]["containers"] for p in c["ports"]}
    spec = policy["spec"]
    assert policy["metadata"]["namespace"] == "kvpool-system"
    assert selects(spec["podSelector"], group["metadata"]["labels"])  # every group pod the operator builds ...
    assert not selects(spec["podSelector"], operator_pod)  # ... and not the operator
    assert spec["policyTypes"] == ["Ingress"]
    door, public = spec["ingress"]
    (peer,) = door["from"]
    assert selects(peer["podSelector"], operator_pod)
    assert set(peer) == {"podSelector"}  # the policy's own namespace: the operator's
    assert "from" not in public  # the OpenAI ports: anyone
    open_ports = {p["port"] for p in public["ports"]}
    assert {p for n, p in ports.items() if n.startswith("admin-")}.isdisjoint(open_ports)
    assert {p for n, p in ports.items() if n.startswith("http")} <= open_ports  # the router's and every server's
    assert "NetworkPolicy" not in {d["kind"] for d in render("--set", "networkPolicy.enabled=false")}


def test_the_values_schema_for_groups_is_the_crds_own_schema() -> None:
    """One source: the chart checks ``groups`` with what the API server admits (generated)."""
    schema = json.loads((CHART / "values.schema.json").read_text())
    generated = values_schema_groups()
    hint = "regenerate: python -m kvpool_operator.crd --values-schema helm/kvpool/values.schema.json"
    assert schema["properties"]["groups"] == generated["groups"], hint
    assert schema["definitions"]["bytes"] == generated["bytes"], hint


def test_the_chart_carries_exactly_the_operators_crd_and_rbac_rules() -> None:
    crd = yaml.safe_load((CHART / "crds" / "colocatedmodels.kvpool.dev.yaml").read_text())
    assert {p.name for p in (CHART / "crds").iterdir()} == {"colocatedmodels.kvpool.dev.yaml",
                                                          "clusterkopfpeerings.kopf.dev.yaml"}  # fmt: skip
    assert crd == build_crd(), (
        "regenerate: python -m kvpool_operator.crd > helm/kvpool/crds/colocatedmodels.kvpool.dev.yaml"
    )
    (role,) = [d for d in render() if d["kind"] == "ClusterRole"]
    assert role["rules"] == rules()  # the rules the RBAC end-to-end test proves sufficient


@pytest.mark.parametrize(
    ("values", "message"),
    [
        (["--set", "operator.replicas=0"], "/operator/replicas"),
        (["--set", "operater.replicas=1"], "operater"),
        (["--set", "groups[0].name=Bad_Name", "--set", "groups[0].gpuMemoryBudgetBytes=1Gi",
          "--set", "groups[0].models[0].name=a"], "/groups/0/name"),
        (["--set-json", 'groups=[{"name":"g","gpuMemoryBudgetBytes":"lots","models":[]}]'], "gpuMemoryBudgetBytes"),
        (["--set", "monitoring.prometheusRule.nearBudgetRatio=2"], "nearBudgetRatio"),
        (["--set-json", 'groups=[{"name":"g","gpuMemoryBudgetBytes":1,"models":[{"name":"a","model":"m","minBytes":0,'
          '"maxBytes":1}],"workload":{"pod":{"nodeSelectors":{}}}}]'], "/groups/0/workload/pod"),
    ],
)  # fmt: skip
def test_the_values_schema_rejects_bad_values_with_the_key_named(values: list[str], message: str) -> None:
    out = helm("template", "kv", str(CHART), *values, check=False)
    assert out.returncode != 0
    assert "values don't meet the specifications of the schema" in out.stderr
    assert message in out.stderr


@pytest.mark.e2e
def test_install_on_a_real_api_server(cluster: Cluster, tmp_path: Path) -> None:
    kubeconfig = str(cluster.kubeconfig())
    kubectl = [str(BIN / "kubectl"), "--kubeconfig", kubeconfig]
    subprocess.run([*kubectl, "apply", "-f", str(CHART / "crds")], check=True, capture_output=True, timeout=60)
    subprocess.run([*kubectl, "wait", "--for=condition=Established", "crd/colocatedmodels.kvpool.dev"], check=True,
                   capture_output=True, timeout=60)  # fmt: skip
    subprocess.run([*kubectl, "create", "namespace", "kvpool-system"], check=True, capture_output=True, timeout=60)
    rendered = tmp_path / "rendered.yaml"
    rendered.write_text(helm("template", "kv", str(CHART), "-n", "kvpool-system", "-f", str(VALUES)).stdout)
    dry = subprocess.run([*kubectl, "apply", "--dry-run=server", "-n", "kvpool-system", "-f", str(rendered)],
                         capture_output=True, text=True, timeout=60)  # fmt: skip
    assert dry.returncode == 0, dry.stderr
    assert "colocatedmodels.kvpool.dev/pair created (server dry run)" in dry.stdout
    helm("install", "kv", str(CHART), "-n", "kvpool-system", "-f", str(VALUES), "--kubeconfig", kubeconfig)
    kinds = "deploy,sa,svc,configmap,colocatedmodels"
    got = subprocess.run([*kubectl, "-n", "kvpool-system", "get", kinds, "-o", "name"],
                         capture_output=True, text=True, check=True, timeout=60).stdout.split()  # fmt: skip
    for name in ("deployment.apps/kv-kvpool-operator", "serviceaccount/kv-kvpool-operator",
                 "service/kv-kvpool-operator", "configmap/kv-kvpool-dashboard",
                 "colocatedmodels.kvpool.dev/pair", "colocatedmodels.kvpool.dev/trio"):  # fmt: skip
        assert name in got, got
    helm("uninstall", "kv", "-n", "kvpool-system", "--kubeconfig", kubeconfig)
