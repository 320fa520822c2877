"""The ColocatedModels spec: quantities parse, defaults apply, and every invalid field is named --
the workload's device, model sources and pod overlay included."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kvpool_operator.fields import freeze, thaw
from kvpool_operator.podspec import HuggingFace, ModelVolume, PodOverlay
from kvpool_operator.policy import Arbitration
from kvpool_operator.spec import Device, Mode, SpecError, parse_group, quantity

from tests.operator.schema_values import JSON, values

GiB, MiB = 1 << 30, 1 << 20


def make_spec(**overrides: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "gpuMemoryBudgetBytes": "40Gi",
        "models": [
            {"name": "llama", "model": "/models/llama", "minBytes": "4Gi", "maxBytes": "30Gi", "weight": 2},
            {"name": "qwen", "model": "/models/qwen", "minBytes": 4 * GiB, "maxBytes": "30Gi"},
        ],
    }
    spec.update(overrides)
    return spec


def test_a_representative_spec_parses_with_defaults() -> None:
    group = parse_group(make_spec())
    assert group.policy.budget_bytes == 40 * GiB
    assert [(m.name, m.min_bytes, m.max_bytes, m.weight) for m in group.policy.models] == [
        ("llama", 4 * GiB, 30 * GiB, 2.0),
        ("qwen", 4 * GiB, 30 * GiB, 1.0),
    ]
    assert (group.interval_s, group.policy.hysteresis_bytes, group.policy.max_step_bytes) == (1.0, 64 * MiB, GiB)
    assert group.models[0].model == "/models/llama"
    assert (group.policy.arbitration, group.policy.dwell_rounds) == (Arbitration.DEMAND, 8)  # 8 intervals


def test_the_policy_and_its_dwell_are_chosen_in_the_spec() -> None:
    group = parse_group(make_spec(rebalance={"intervalSeconds": 4, "policy": "proportional", "minDwellSeconds": 10}))
    assert (group.policy.arbitration, group.policy.dwell_rounds) == (Arbitration.PROPORTIONAL, 3)  # ceil(10 / 4)


@pytest.mark.parametrize(("value", "expected"), [(5, 5), ("512Mi", 512 * MiB), ("3G", 3 * 10**9), ("7", 7)])
def test_quantities(value: Any, expected: int) -> None:
    assert quantity(value, "x") == expected


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"gpuMemoryBudgetBytes": "lots"}, "spec.gpuMemoryBudgetBytes: 'lots' is not a byte quantity"),
        ({"models": []}, "spec.models: list at least one model"),
        (
            {"models": [{"name": f"m{i}", "model": "m", "minBytes": 0, "maxBytes": 1} for i in range(17)]},
            "spec.models: at most 16 models share one pod, got 17",
        ),
        ({"models": [{"name": "A_b", "model": "m", "minBytes": 0, "maxBytes": 1}]}, "spec.models[0].name"),
        ({"models": [{"name": "a", "model": "m", "maxBytes": 1}]}, r"spec.models[0].minBytes is required"),
        ({"models": [{"name": "a", "model": "m", "minBytes": 5, "maxBytes": 4}]}, "minBytes (5) must not exceed"),
        ({"models": [{"name": "a", "model": "m", "minBytes": 0, "maxBytes": 4, "weight": 0}]}, ".weight: 0"),
        ({"models": [{"name": "a", "model": "m", "minBytes": 0, "maxBytes": 4, "weight": 1e308}]}, "up to 1000000"),
        ({"rebalance": {"intervalSeconds": 0}}, "spec.rebalance.intervalSeconds"),
        ({"rebalance": {"policy": "greedy"}}, "spec.rebalance.policy: 'greedy' is not a policy; use one of demand"),
        ({"rebalance": {"minDwellSeconds": -1}}, "spec.rebalance.minDwellSeconds: -1 must be a number of seconds"),
        ({"gpuMemoryBudgetBytes": "6Gi"}, "add up to 8589934592 bytes, more than spec.gpuMemoryBudgetBytes"),
    ],
)
def test_invalid_specs_name_the_field(overrides: dict[str, Any], message: str) -> None:
    with pytest.raises(SpecError) as exc:
        parse_group(make_spec(**overrides))
    assert message in str(exc.value)


def test_duplicate_model_names_are_refused() -> None:
    models = [{"name": "a", "model": "m", "minBytes": 0, "maxBytes": 1}] * 2
    with pytest.raises(SpecError, match="names must be unique"):
        parse_group(make_spec(models=models))


# spec.workload: the device, the model sources and the pod overlay (kvpool_operator.podspec)

GPU_TOLERATION = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
FULL_POD: dict[str, Any] = {
    "nodeSelector": {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"},
    "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "ml", "effect": "NoSchedule"}],
    "affinity": {"podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": []}},
    "resources": {"requests": {"cpu": "8", "memory": "64Gi"}, "limits": {"memory": "96Gi", "cpu": 16}},
    "imagePullSecrets": [{"name": "registry"}],
    "priorityClassName": "inference",
    "serviceAccountName": "models",
    "env": [{"name": "VLLM_LOGGING_LEVEL", "value": "DEBUG"}],
    "envFrom": [{"configMapRef": {"name": "tuning"}}],
    "volumes": [{"name": "scratch", "emptyDir": {}}],
    "volumeMounts": [{"name": "scratch", "mountPath": "/scratch"}, {"name": "models", "mountPath": "/more"}],
    "labels": {"team": "ml"},
    "annotations": {"example.com/owner": "ml"},
}


def workload(**fields: Any) -> Any:
    return parse_group(make_spec(workload=fields)).workload


def test_workload_defaults_run_on_the_gpu_offline_and_tolerate_gpu_nodes() -> None:
    w = workload()
    assert (w.mode, w.device, w.image) == (Mode.DEVICE_PLUGIN, Device.GPU, "ghcr.io/kvpool/kvpool:0.1.0")
    assert (w.model_volume, w.hugging_face) == (None, None)  # no cache volume; the builders set HF_HUB_OFFLINE=1
    assert thaw(w.pod.tolerations) == [GPU_TOLERATION]
    assert w.pod == PodOverlay()  # the dataclass's defaults are the gpu device's


def test_cpu_device_drops_the_gpu_toleration_and_defaults_to_the_cpu_image() -> None:
    w = workload(device="cpu")
    assert (w.device, w.image, w.pod.tolerations) == (Device.CPU, "ghcr.io/kvpool/kvpool:0.1.0-cpu", ())
    assert workload(device="cpu", image="me/kvpool:dev").image == "me/kvpool:dev"


@pytest.mark.parametrize(("tolerations", "expected"), [([], []), ([{"operator": "Exists"}], [{"operator": "Exists"}])])
def test_given_tolerations_replace_the_gpu_default(tolerations: list[Any], expected: list[Any]) -> None:
    assert thaw(workload(pod={"tolerations": tolerations}).pod.tolerations) == expected


def test_every_pod_overlay_field_is_parsed() -> None:
    w = workload(modelVolume={"persistentVolumeClaim": {"claimName": "models"}}, pod=FULL_POD)
    pod = w.pod
    assert thaw(pod.node_selector) == FULL_POD["nodeSelector"]
    assert thaw(pod.tolerations) == FULL_POD["tolerations"]
    assert thaw(pod.affinity) == FULL_POD["affinity"]
    assert (thaw(pod.requests), thaw(pod.limits)) == ({"cpu": "8", "memory": "64Gi"}, {"memory": "96Gi", "cpu": 16})
    assert thaw(pod.image_pull_secrets) == [{"name": "registry"}]
    assert (pod.priority_class_name, pod.service_account_name) == ("inference", "models")
    assert (thaw(pod.env), thaw(pod.env_from)) == (FULL_POD["env"], FULL_POD["envFrom"])
    assert (thaw(pod.volumes), thaw(pod.volume_mounts)) == (FULL_POD["volumes"], FULL_POD["volumeMounts"])
    assert (thaw(pod.labels), thaw(pod.annotations)) == (FULL_POD["labels"], FULL_POD["annotations"])


def test_model_volume_and_hugging_face_are_parsed_with_their_defaults() -> None:
    w = workload(modelVolume={"hostPath": {"path": "/srv/models"}}, huggingFace={})
    assert w.model_volume == ModelVolume(freeze({"hostPath": {"path": "/srv/models"}}), "/models")
    assert w.hugging_face == HuggingFace(download=False, token_secret=None, cache_volume=freeze({"emptyDir": {}}))
    cache = {"persistentVolumeClaim": {"claimName": "hf"}}
    w = workload(modelVolume={"hostPath": {"path": "/m"}}, modelMountPath="/weights/", huggingFace={
        "download": True, "tokenSecret": "hf-token", "cacheVolume": cache})  # fmt: skip
    assert w.model_volume.mount_path == "/weights"
    assert w.hugging_face == HuggingFace(download=True, token_secret="hf-token", cache_volume=freeze(cache))


def test_the_parsed_workload_is_frozen_all_the_way_down() -> None:
    raw = {"pod": {"nodeSelector": {"a": "b"}, "tolerations": [{"key": "k"}]}}
    w = parse_group(make_spec(workload=raw)).workload
    raw["pod"]["tolerations"][0]["key"] = "changed"  # the caller's dict is not shared
    assert w.pod.tolerations[0]["key"] == "k"
    with pytest.raises(TypeError):
        w.pod.tolerations[0]["key"] = "x"  # type: ignore[index]
    with pytest.raises(TypeError):
        w.pod.node_selector["a"] = "c"  # type: ignore[index]


POD = "spec.workload.pod"


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"device": "tpu"}, "spec.workload.device: 'tpu' must be gpu or cpu"),
        ({"mode": "dra", "device": "cpu"}, "spec.workload.device: cpu needs mode devicePlugin"),
        ({"modelVolume": "pvc"}, "spec.workload.modelVolume: must be an object"),
        ({"modelVolume": {}}, "spec.workload.modelVolume: give exactly one volume source"),
        ({"modelVolume": {"hostPath": {"path": "/a"}, "emptyDir": {}}}, "spec.workload.modelVolume: give exactly one"),
        ({"modelVolume": {"hostPath": "/a"}}, "spec.workload.modelVolume.hostPath: must be an object"),
        ({"modelMountPath": "/models"}, "spec.workload.modelMountPath: set spec.workload.modelVolume too"),
        ({"modelVolume": {"emptyDir": {}}, "modelMountPath": "models"}, "spec.workload.modelMountPath: 'models'"),
        ({"modelVolume": {"emptyDir": {}}, "modelMountPath": "/tmp"}, "spec.workload.modelMountPath: '/tmp'"),
        ({"huggingFace": []}, "spec.workload.huggingFace: must be an object"),
        ({"huggingFace": {"download": "yes"}}, "spec.workload.huggingFace.download: 'yes' must be true or false"),
        ({"huggingFace": {"tokenSecret": 1}}, "spec.workload.huggingFace.tokenSecret: must be a string"),
        ({"huggingFace": {"cacheVolume": {}}}, "spec.workload.huggingFace.cacheVolume: give exactly one"),
        ({"pod": []}, f"{POD}: must be an object"),
        ({"pod": {"hostNetwork": True}}, f"{POD}.hostNetwork: not a field the overlay sets"),
        ({"pod": {"nodeSelector": {"gpu": True}}}, f"{POD}.nodeSelector.gpu: must be a string"),
        ({"pod": {"tolerations": {"key": "k"}}}, f"{POD}.tolerations: must be a list"),
        ({"pod": {"tolerations": ["k"]}}, f"{POD}.tolerations[0]: must be an object"),
        ({"pod": {"affinity": []}}, f"{POD}.affinity: must be an object"),
        ({"pod": {"resources": {"claims": []}}}, f"{POD}.resources.claims: give requests and limits only"),
        ({"pod": {"resources": {"limits": []}}}, f"{POD}.resources.limits: must be an object"),
        ({"pod": {"resources": {"requests": {"cpu": 0.5}}}}, f"{POD}.resources.requests.cpu: 0.5 must be a quantity"),
        ({"pod": {"resources": {"limits": {"nvidia.com/gpu": "2"}}}}, f"{POD}.resources.limits.nvidia.com/gpu: the"),
        ({"pod": {"imagePullSecrets": [{}]}}, f"{POD}.imagePullSecrets[0].name is required"),
        ({"pod": {"priorityClassName": 1}}, f"{POD}.priorityClassName: must be a string"),
        ({"pod": {"serviceAccountName": ["a"]}}, f"{POD}.serviceAccountName: must be a string"),
        ({"pod": {"env": [{"value": "1"}]}}, f"{POD}.env[0].name is required"),
        ({"pod": {"env": [{"name": ""}]}}, f"{POD}.env[0].name: must not be empty"),
        ({"pod": {"envFrom": {}}}, f"{POD}.envFrom: must be a list"),
        ({"pod": {"volumes": [{"emptyDir": {}}]}}, f"{POD}.volumes[0].name is required"),
        ({"pod": {"volumes": [{"name": "hf-cache", "emptyDir": {}}]}}, f"{POD}.volumes[0].name: 'hf-cache' is the"),
        ({"pod": {"volumes": [{"name": "tmp", "emptyDir": {}}]}}, f"{POD}.volumes[0].name: 'tmp' is the operator's"),
        ({"pod": {"volumes": [{"name": "a"}, {"name": "a"}]}}, f"{POD}.volumes[1].name: 'a' names two volumes"),
        ({"pod": {"volumeMounts": [{"name": "a"}]}}, f"{POD}.volumeMounts[0].mountPath is required"),
        ({"pod": {"volumeMounts": [{"name": "x", "mountPath": "/x"}]}}, f"{POD}.volumeMounts[0].name: 'x' is not"),
        ({"pod": {"volumeMounts": [{"name": "models", "mountPath": "/x"}]}}, f"{POD}.volumeMounts[0].name: 'models'"),
        ({"pod": {"volumeMounts": [{"name": "tmp", "mountPath": "/dev/shm/"}]}}, f"{POD}.volumeMounts[0].mountPath"),
        ({"pod": {"labels": {"kvpool.dev/group": "other"}}}, f"{POD}.labels.kvpool.dev/group: the operator's own"),
        ({"pod": {"labels": {"app.kubernetes.io/name": "x"}}}, f"{POD}.labels.app.kubernetes.io/name: the operator"),
        ({"pod": {"annotations": {"a": 1}}}, f"{POD}.annotations.a: must be a string"),
    ],
)  # fmt: skip
def test_invalid_workloads_name_the_field(fields: dict[str, Any], message: str) -> None:
    with pytest.raises(SpecError) as exc:
        workload(**fields)
    assert message in str(exc.value)


def test_a_mount_may_use_a_builder_volume_that_the_pod_has() -> None:
    mounts = [{"name": "models", "mountPath": "/b"}, {"name": "hf-cache", "mountPath": "/c"}]
    w = workload(modelVolume={"emptyDir": {}}, huggingFace={}, pod={"volumeMounts": mounts})
    assert [m["name"] for m in w.pod.volume_mounts] == ["models", "hf-cache"]


# Generated specs: every spec the CRD admits is parsed or refused with its field named, and every
# spec parsed is built; values the CRD would refuse (a client that skips validation, an older CRD)
# are refused by name too, never with a crash.


def _crd_spec_schema() -> Any:
    from kvpool_operator.crd import build_crd

    return build_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]


def _built_or_refused_by_name(spec: Any) -> None:
    from kvpool_operator.builders import manifests

    try:
        group = parse_group(spec)
    except SpecError as e:
        refusal = str(e)
    else:
        refusal = ""
    if refusal:
        assert refusal.startswith("spec"), f"a refusal that names no field: {refusal}"
        return
    body = {"metadata": {"name": "g", "namespace": "ns", "uid": "u"}}
    objs = manifests(body, group)
    assert objs[-1]["kind"] == "Deployment"
    json.dumps(objs)  # what the apply sends (the overlay's own PodSpec content is the API server's to judge)


@settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
@given(spec=values(_crd_spec_schema()))
def test_every_spec_the_crd_admits_is_built_or_refused_naming_its_field(spec: dict[str, Any]) -> None:
    _built_or_refused_by_name(spec)


FULL = make_spec(
    workload={"mode": "dra", "device": "gpu", "replicas": 2, "image": "i", "adminTokenSecret": "s",
              "offloadBytes": "1Gi", "modelVolume": {"persistentVolumeClaim": {"claimName": "m"}},
              "huggingFace": {"download": True, "tokenSecret": "t", "cacheVolume": {"emptyDir": {}}},
              "pod": {"nodeSelector": {"a": "b"}, "env": [{"name": "A", "value": "1"}], "labels": {"x": "y"}}},
    rebalance={"intervalSeconds": 5, "policy": "demand", "hysteresisBytes": "1Mi"},
)  # fmt: skip


def _paths(value: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [prefix] if prefix else []
    children = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else []
    for key, child in children:
        out += _paths(child, (*prefix, key))
    return out


@settings(max_examples=300, deadline=None)
@given(where=st.sampled_from(_paths(FULL)), value=JSON)
def test_any_value_anywhere_is_built_or_refused_naming_its_field(where: tuple[Any, ...], value: Any) -> None:
    import copy

    spec = copy.deepcopy(FULL)
    parent = spec
    for key in where[:-1]:
        parent = parent[key]
    parent[where[-1]] = value
    _built_or_refused_by_name(spec)
