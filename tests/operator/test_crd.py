"""The CRD: a structural v1 schema whose required fields and patterns agree with the spec parser;
PodSpec content passes through (on a real 1.20 API server too); the chart's values schema is the
same schema in JSON Schema."""

from __future__ import annotations

import re
import time
from typing import Any

import pytest
from kubernetes import client as k8s
from kubernetes import config as k8s_config
from kvpool_operator.crd import GROUP, KIND, PLURAL, VERSION, build_crd, values_schema_groups
from kvpool_operator.spec import NAME_RE, QUANTITY_RE, parse_group, quantity

from tests.k8s.cluster import Cluster


def test_the_crd_is_namespaced_versioned_with_status_and_printer_columns() -> None:
    crd = build_crd()
    assert crd["metadata"]["name"] == f"{PLURAL}.{GROUP}" == "colocatedmodels.kvpool.dev"
    (version,) = crd["spec"]["versions"]
    assert (version["name"], version["served"], version["storage"]) == ("v1alpha1", True, True)
    assert version["subresources"] == {"status": {}}
    assert [c["name"] for c in version["additionalPrinterColumns"]] == [
        "Budget",
        "Ready",
        "Balanced",
        "Degraded",
        "Age",
    ]


def test_schema_required_fields_and_patterns_match_the_parser() -> None:
    spec = build_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    assert spec["required"] == ["gpuMemoryBudgetBytes", "models"]
    model = spec["properties"]["models"]["items"]
    assert model["required"] == ["name", "model", "minBytes", "maxBytes"]
    assert model["properties"]["name"]["pattern"] == NAME_RE.pattern
    assert spec["properties"]["gpuMemoryBudgetBytes"]["pattern"] == QUANTITY_RE.pattern
    for text in ("40Gi", "512Mi", "7"):  # what the schema admits, the parser reads
        assert re.match(QUANTITY_RE.pattern, text)
        assert quantity(text, "x") > 0


def test_every_rebalance_field_says_the_default_the_parser_gives_it() -> None:
    spec = build_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    said = {k: v["description"] for k, v in spec["properties"]["rebalance"]["properties"].items()}
    group = parse_group({"gpuMemoryBudgetBytes": "40Gi", "models": [{"name": "a", "model": "/m", "minBytes": "1Gi",
                                                                     "maxBytes": "8Gi"}]})  # fmt: skip
    shown = {"intervalSeconds": f"{group.interval_s:g}", "hysteresisBytes": f"{group.policy.hysteresis_bytes >> 20}Mi",
             "maxStepBytes": f"{group.policy.max_step_bytes >> 30}Gi",
             "minDwellSeconds": f"{group.policy.dwell_rounds} intervals",
             "policy": group.policy.arbitration.value}  # fmt: skip
    assert said.keys() == shown.keys()
    for field, default in shown.items():
        assert re.search(rf"\bdefault\W+{re.escape(default)}\b|^{re.escape(default)} \(default\)", said[field]), field


def test_every_object_in_the_schema_is_structural() -> None:
    def walk(node: dict[str, object], path: str) -> None:
        assert (
            "type" in node or node.get("x-kubernetes-int-or-string") or node.get("x-kubernetes-preserve-unknown-fields")
        ), path
        assert not ("properties" in node and isinstance(node.get("additionalProperties"), dict)), path
        for key, child in (node.get("properties") or {}).items():  # type: ignore[union-attr]
            walk(child, f"{path}.{key}")
        if isinstance(node.get("items"), dict):
            walk(node["items"], f"{path}[]")  # type: ignore[arg-type]
        if isinstance(node.get("additionalProperties"), dict):
            walk(node["additionalProperties"], f"{path}.*")  # type: ignore[arg-type]

    walk(build_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"], "")


def workload_schema() -> dict[str, Any]:
    spec = build_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    schema: dict[str, Any] = spec["properties"]["workload"]
    return schema


def test_the_workload_schema_has_every_field_the_parser_reads() -> None:
    w = workload_schema()["properties"]
    assert set(w) == {"mode", "device", "replicas", "image", "adminTokenSecret", "offloadBytes", "deviceClassName",
                      "modelVolume", "modelMountPath", "huggingFace", "pod"}  # fmt: skip
    assert w["device"] == {"type": "string", "enum": ["gpu", "cpu"], "description": w["device"]["description"]}
    assert set(w["huggingFace"]["properties"]) == {"download", "tokenSecret", "cacheVolume"}
    assert set(w["pod"]["properties"]) == {
        "nodeSelector", "tolerations", "affinity", "resources", "imagePullSecrets", "priorityClassName",
        "serviceAccountName", "env", "envFrom", "volumes", "volumeMounts", "labels", "annotations"}  # fmt: skip


def test_pod_spec_content_passes_through_with_its_shape_checked() -> None:
    w = workload_schema()["properties"]
    pod = w["pod"]["properties"]
    keep = {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
    assert pod["affinity"] == keep
    assert pod["tolerations"] == {"type": "array", "items": keep, "description": pod["tolerations"]["description"]}
    assert pod["volumes"]["items"] == {**keep, "required": ["name"],
                                       "properties": {"name": {"type": "string", "minLength": 1}}}  # fmt: skip
    assert pod["volumeMounts"]["items"]["required"] == ["name", "mountPath"]
    assert pod["labels"] == {"type": "object", "additionalProperties": {"type": "string"}}
    assert pod["resources"]["properties"]["limits"]["additionalProperties"] == {"x-kubernetes-int-or-string": True}
    for source in (w["modelVolume"], w["huggingFace"]["properties"]["cacheVolume"]):  # exactly one volume source
        assert (source["minProperties"], source["maxProperties"]) == (1, 1)


def test_the_values_schema_keeps_pod_content_open_and_resource_quantities_free() -> None:
    """Byte fields use the bytes grammar; Kubernetes quantities (500m, 1.5Gi) are any string."""
    workload = values_schema_groups()["groups"]["items"]["properties"]["workload"]
    pod = workload["properties"]["pod"]
    assert workload["additionalProperties"] is False  # a typo in a group's workload names its key
    assert pod["additionalProperties"] is False
    assert pod["properties"]["tolerations"] == {"type": "array", "items": {"type": "object"}}
    assert "additionalProperties" not in pod["properties"]["volumes"]["items"]  # a Volume's source passes
    assert pod["properties"]["resources"]["properties"]["requests"] == {
        "type": "object", "additionalProperties": {"type": ["integer", "string"]}}  # fmt: skip
    assert workload["properties"]["offloadBytes"] == {"$ref": "#/definitions/bytes"}


@pytest.mark.e2e
@pytest.mark.slow
def test_the_api_server_admits_every_workload_field_and_prunes_none(cluster: Cluster) -> None:
    """Kubernetes 1.20 serves the schema as structural, keeps PodSpec content it does not know
    field by field (nothing pruned), and refuses a bad device at admission."""
    api = k8s_config.new_client_from_config(config_file=str(cluster.kubeconfig()))
    ext = k8s.ApiextensionsV1Api(api)
    try:
        ext.create_custom_resource_definition(build_crd())
    except k8s.ApiException as e:  # another test installed the same CRD
        if e.status != 409:
            raise
    for _ in range(100):
        crd = ext.read_custom_resource_definition(f"{PLURAL}.{GROUP}")
        if any(c.type == "Established" and c.status == "True" for c in crd.status.conditions or []):
            break
        time.sleep(0.2)
    workload = {
        "device": "cpu", "modelVolume": {"hostPath": {"path": "/srv/models", "type": "Directory"}},
        "modelMountPath": "/weights", "huggingFace": {"download": True, "tokenSecret": "hf", "cacheVolume": {
            "persistentVolumeClaim": {"claimName": "hf"}}},
        "pod": {
            "nodeSelector": {"pool": "cpu"},
            "tolerations": [{"key": "k", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 5}],
            "affinity": {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
                {"weight": 1, "preference": {"matchExpressions": [{"key": "z", "operator": "In", "values": ["a"]}]}}]}},
            "resources": {"requests": {"cpu": "500m", "memory": 1073741824}, "limits": {"memory": "2Gi"}},
            "imagePullSecrets": [{"name": "registry"}], "priorityClassName": "p", "serviceAccountName": "sa",
            "env": [{"name": "A", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}],
            "envFrom": [{"secretRef": {"name": "s"}, "prefix": "S_"}],
            "volumes": [{"name": "scratch", "emptyDir": {"sizeLimit": "1Gi"}}],
            "volumeMounts": [{"name": "scratch", "mountPath": "/scratch", "subPath": "x"}],
            "labels": {"team": "ml"}, "annotations": {"a": "b"},
        },
    }  # fmt: skip
    custom = k8s.CustomObjectsApi(api)
    body = {"apiVersion": f"{GROUP}/{VERSION}", "kind": KIND, "metadata": {"name": "every-field"}, "spec": {
        "gpuMemoryBudgetBytes": "1Gi", "models": [{"name": "a", "model": "m", "minBytes": 0, "maxBytes": 1}],
        "workload": workload}}  # fmt: skip
    created = custom.create_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, body)
    try:
        assert created["spec"]["workload"] == workload
        parse_group(created["spec"])  # what the API server keeps, the parser accepts
        bad = {**body, "metadata": {"name": "bad-device"}, "spec": {**body["spec"], "workload": {"device": "tpu"}}}
        with pytest.raises(k8s.ApiException) as exc:
            custom.create_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, bad)
        assert exc.value.status == 422
        assert "spec.workload.device" in exc.value.body
    finally:
        custom.delete_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, "every-field")
