"""The builders: exact manifests for representative specs, both GPU modes and the CPU device, the
pod overlay where it belongs, owner references everywhere, and every manifest valid for
Kubernetes 1.34 and 1.37 (offline schemas, strict)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kvpool_operator.builders import deployment, manifests, router_args, services
from kvpool_operator.podspec import BUILDER_LABELS
from kvpool_operator.policy import initial_limits
from kvpool_operator.spec import SpecError, parse_group

GiB = 1 << 30
BODY = {"metadata": {"name": "pair", "namespace": "ml", "uid": "u-1"}}
OWNER = {"apiVersion": "kvpool.dev/v1alpha1", "kind": "ColocatedModels", "name": "pair", "uid": "u-1",
         "controller": True, "blockOwnerDeletion": True}  # fmt: skip


def spec(**workload: Any) -> dict[str, Any]:
    return {
        "gpuMemoryBudgetBytes": "40Gi",
        "models": [
            {"name": "llama", "model": "/models/llama", "minBytes": "4Gi", "maxBytes": "30Gi", "weight": 3},
            {
                "name": "qwen",
                "model": "/models/qwen",
                "minBytes": "4Gi",
                "maxBytes": "30Gi",
                "args": ["--max-model-len", "4096"],
            },
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
         "args": ["--host", "0.0.0.0", "--port", "9000", "--log-json", "true",
                  "--admin-token-file", "/var/run/kvpool/admin-token/token", "--upstream=llama=http://127.0.0.1:8000",
                  "--upstream=qwen=http://127.0.0.1:8001"]},
        {"name": "llama", "args": ["--model", "/models/llama", "--served-model-name", "llama", "--host", "0.0.0.0",
                                   "--port", "8000", "--admin-port", "8100",
                                   "--admin-token-file", "/var/run/kvpool/admin-token/token",
                                   "--backend", "cuda", "--limit-bytes", str(28 * GiB),
                                   "--virtual-bytes", str(30 * GiB), "--log-json", "true",
                                   "--ledger-bytes", str(40 * GiB), "--offload-bytes", str(2 * GiB),
                                   "--offload-dir", "/dev/shm"]},
        {"name": "qwen", "args": ["--model", "/models/qwen", "--served-model-name", "qwen", "--host", "0.0.0.0",
                                  "--port", "8001", "--admin-port", "8101",
                                  "--admin-token-file", "/var/run/kvpool/admin-token/token",
                                  "--backend", "cuda", "--limit-bytes", str(12 * GiB),
                                  "--virtual-bytes", str(30 * GiB), "--log-json", "true",
                                  "--ledger-bytes", str(40 * GiB), "--offload-bytes", str(2 * GiB),
                                  "--offload-dir", "/dev/shm", "--max-model-len", "4096"]},
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
                    "env": [{"name": "HOME", "value": "/tmp"}, {"name": "HF_HUB_OFFLINE", "value": "1"}],
                    "ports": [{"name": "http", "containerPort": 9000}, {"name": "http-0", "containerPort": 8000},
                              {"name": "http-1", "containerPort": 8001}, {"name": "admin-0", "containerPort": 8100},
                              {"name": "admin-1", "containerPort": 8101}],
                    "readinessProbe": {"httpGet": {"path": "/readyz", "port": 9000}, **probe},
                    "livenessProbe": {"httpGet": {"path": "/livez", "port": 9000}, **probe, "initialDelaySeconds": 600},
                    "securityContext": {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
                                        "capabilities": {"drop": ["ALL"]}},
                    "volumeMounts": [{"name": "tmp", "mountPath": "/tmp"}, {"name": "shm", "mountPath": "/dev/shm"},
                                     {"name": "admin-token", "mountPath": "/var/run/kvpool/admin-token",
                                      "readOnly": True}],
                    "resources": {"limits": {"nvidia.com/gpu": "1"}},
                }],
                "volumes": [{"name": "tmp", "emptyDir": {}},
                            {"name": "shm", "emptyDir": {"medium": "Memory", "sizeLimit": str(5 * GiB)}},
                            {"name": "admin-token", "secret": {"secretName": "pair-admin",
                                                               "items": [{"key": "token", "path": "token"}]}}],
                "terminationGracePeriodSeconds": 60,
                "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
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
    assert names == ["http", "http-0", "admin-0", "http-1", "admin-1"]  # unique within the pod
    assert pod["containers"][0]["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": 9000}
    assert dep["spec"]["replicas"] == 2


def test_services_one_per_model_and_one_for_the_group_on_its_router() -> None:
    svcs = services(BODY, parse_group(spec()))
    seen = [(s["metadata"]["name"], s["metadata"]["labels"].get("kvpool.dev/model"), s["spec"]["ports"]) for s in svcs]
    assert seen == [
        ("pair-llama", "llama", [{"name": "http", "port": 80, "targetPort": 8000, "protocol": "TCP"},
                                 {"name": "admin", "port": 8100, "targetPort": 8100, "protocol": "TCP"}]),
        ("pair-qwen", "qwen", [{"name": "http", "port": 80, "targetPort": 8001, "protocol": "TCP"},
                               {"name": "admin", "port": 8100, "targetPort": 8101, "protocol": "TCP"}]),
        ("pair", None, [{"name": "http", "port": 80, "targetPort": 9000, "protocol": "TCP"}]),  # the router
    ]  # fmt: skip
    assert all(s["spec"]["selector"] == {"kvpool.dev/group": "pair"} for s in svcs)
    assert all(s["metadata"]["ownerReferences"] == [OWNER] for s in svcs)


# spec.workload: device, model sources and the pod overlay, where each lands in the Deployment

OVERLAY: dict[str, Any] = {
    "nodeSelector": {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"},
    "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "ml", "effect": "NoSchedule"}],
    "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]}]}}},
    "resources": {"requests": {"cpu": "8", "memory": "64Gi"}, "limits": {"memory": "96Gi"}},
    "imagePullSecrets": [{"name": "registry"}],
    "priorityClassName": "inference",
    "serviceAccountName": "models",
    "env": [{"name": "VLLM_LOGGING_LEVEL", "value": "DEBUG"}, {"name": "HOME", "value": "/scratch"}],
    "envFrom": [{"configMapRef": {"name": "tuning"}}],
    "volumes": [{"name": "scratch", "emptyDir": {}}],
    "volumeMounts": [{"name": "scratch", "mountPath": "/scratch"}],
    "labels": {"team": "ml"},
    "annotations": {"example.com/owner": "ml"},
}  # fmt: skip
POD_FIELDS = {
    "nodeSelector": OVERLAY["nodeSelector"], "tolerations": OVERLAY["tolerations"], "affinity": OVERLAY["affinity"],
    "imagePullSecrets": [{"name": "registry"}], "priorityClassName": "inference", "serviceAccountName": "models",
}  # fmt: skip
MODELS_PVC = {"persistentVolumeClaim": {"claimName": "models"}}


def pod_of(**workload: Any) -> dict[str, Any]:
    pod: dict[str, Any] = deployment(BODY, parse_group(spec(**workload)))["spec"]["template"]["spec"]
    return pod


def env_of(container: dict[str, Any]) -> dict[str, Any]:
    env = container["env"]
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in env if e["name"] != "KVPOOL_GROUP_SERVERS"}


def server_argvs(pod: dict[str, Any]) -> list[list[str]]:
    """Every model server's argv: from the launcher's list (devicePlugin) or the containers (dra)."""
    (first, *rest) = pod["containers"]
    if first["name"] == "models":
        servers = json.loads(next(e["value"] for e in first["env"] if e["name"] == "KVPOOL_GROUP_SERVERS"))
        return [s["args"] for s in servers if s["name"] != "router"]
    return [c["command"][3:] for c in rest]


@pytest.mark.parametrize("mode", ["devicePlugin", "dra"])
def test_gpu_servers_run_the_cuda_backend_and_never_force_eager_mode(mode: str) -> None:
    argvs = server_argvs(pod_of(mode=mode))
    assert len(argvs) == 2
    for argv in argvs:
        assert argv[argv.index("--backend") + 1] == "cuda"
        assert "--enforce-eager" not in argv  # the server's default keeps CUDA graphs on with cuda


def test_cpu_device_requests_no_gpu_and_runs_the_host_backend() -> None:
    pod = pod_of(device="cpu")
    (c,) = pod["containers"]
    assert c["image"] == "ghcr.io/kvpool/kvpool:0.1.0-cpu"
    assert "resources" not in c
    assert "tolerations" not in pod  # no GPU toleration: the pod belongs on any node
    for argv in server_argvs(pod):
        assert argv[argv.index("--backend") + 1] == "host"
    pod = pod_of(device="cpu", pod={"resources": {"requests": {"cpu": "4"}}})
    assert pod["containers"][0]["resources"] == {"requests": {"cpu": "4"}}


def test_the_model_tiny_is_the_servers_embedded_model_as_in_the_group_launcher() -> None:
    body = spec(device="cpu")
    body["models"][0]["model"] = "tiny"
    pod = deployment(BODY, parse_group(body))["spec"]["template"]["spec"]
    tiny, qwen = server_argvs(pod)
    assert "--model" not in tiny  # no model flag: kvpool-server builds its embedded tiny model
    assert qwen[qwen.index("--model") + 1] == "/models/qwen"


def test_the_overlay_lands_on_the_pod_and_the_models_container() -> None:
    dep = deployment(BODY, parse_group(spec(pod=OVERLAY)))
    template = dep["spec"]["template"]
    assert template["metadata"] == {"labels": {"team": "ml", **labels()}, "annotations": {"example.com/owner": "ml"}}
    assert dep["spec"]["selector"] == {"matchLabels": {"kvpool.dev/group": "pair"}}
    pod = template["spec"]
    assert {k: pod[k] for k in POD_FIELDS} == POD_FIELDS
    assert [v["name"] for v in pod["volumes"]] == ["tmp", "shm", "scratch"]
    (c,) = pod["containers"]
    assert [e["name"] for e in c["env"]] == ["HF_HUB_OFFLINE", "KVPOOL_GROUP_SERVERS", "VLLM_LOGGING_LEVEL", "HOME"]
    assert env_of(c)["HOME"] == "/scratch"  # the user's entry replaced the builder's
    assert c["envFrom"] == [{"configMapRef": {"name": "tuning"}}]
    assert c["volumeMounts"] == [{"name": "tmp", "mountPath": "/tmp"}, {"name": "shm", "mountPath": "/dev/shm"},
                                 {"name": "scratch", "mountPath": "/scratch"}]  # fmt: skip
    assert c["resources"] == {"requests": {"cpu": "8", "memory": "64Gi"},
                              "limits": {"memory": "96Gi", "nvidia.com/gpu": "1"}}  # fmt: skip


def test_in_dra_mode_the_overlay_lands_on_every_model_container_but_not_the_router() -> None:
    pod = pod_of(mode="dra", pod=OVERLAY)
    assert {k: pod[k] for k in POD_FIELDS} == POD_FIELDS
    router, *models = pod["containers"]
    assert [e["name"] for e in router["env"]] == ["HOME"]
    assert [m["name"] for m in router["volumeMounts"]] == ["tmp", "shm"]
    assert "envFrom" not in router
    assert "resources" not in router
    for c in models:
        assert env_of(c) == {"HF_HUB_OFFLINE": "1", "VLLM_LOGGING_LEVEL": "DEBUG", "HOME": "/scratch"}
        assert c["envFrom"] == [{"configMapRef": {"name": "tuning"}}]
        assert [m["name"] for m in c["volumeMounts"]] == ["tmp", "shm", "scratch"]
        assert c["resources"] == {"claims": [{"name": "gpu"}], "requests": {"cpu": "8", "memory": "64Gi"},
                                  "limits": {"memory": "96Gi"}}  # fmt: skip


def test_resource_limits_merge_beside_the_gpu_limit() -> None:
    (c,) = pod_of(pod={"resources": {"limits": {"cpu": "16", "memory": "96Gi"}}})["containers"]
    assert c["resources"] == {"limits": {"cpu": "16", "memory": "96Gi", "nvidia.com/gpu": "1"}}


@pytest.mark.parametrize("mode", ["devicePlugin", "dra"])
def test_the_model_volume_is_mounted_read_only_in_every_model_container(mode: str) -> None:
    pod = pod_of(mode=mode, modelVolume=MODELS_PVC, modelMountPath="/weights")
    assert pod["volumes"][2] == {"name": "models", "persistentVolumeClaim": {"claimName": "models"}}
    models = [c for c in pod["containers"] if c["name"] != "router"]
    assert len(models) == (1 if mode == "devicePlugin" else 2)
    for c in models:
        assert {"name": "models", "mountPath": "/weights", "readOnly": True} in c["volumeMounts"]


def test_hugging_face_download_takes_the_token_from_its_secret_and_drops_the_offline_flag() -> None:
    pod = pod_of(huggingFace={"download": True, "tokenSecret": "hf-token"})
    (c,) = pod["containers"]
    assert env_of(c) == {"HOME": "/tmp", "HF_HOME": "/hf-cache",
                         "HF_TOKEN": {"secretKeyRef": {"name": "hf-token", "key": "token"}}}  # fmt: skip
    assert {"name": "hf-cache", "mountPath": "/hf-cache"} in c["volumeMounts"]
    assert {"name": "hf-cache", "emptyDir": {}} in pod["volumes"]


def test_a_hugging_face_cache_without_download_stays_offline() -> None:
    pvc = {"persistentVolumeClaim": {"claimName": "hf"}}
    pod = pod_of(huggingFace={"cacheVolume": pvc})
    assert env_of(pod["containers"][0]) == {"HOME": "/tmp", "HF_HUB_OFFLINE": "1", "HF_HOME": "/hf-cache"}
    assert {"name": "hf-cache", **pvc} in pod["volumes"]


def test_the_reserved_labels_are_the_builders_own() -> None:
    assert set(labels()) == set(BUILDER_LABELS)


@st.composite
def volumes_and_mounts(draw: st.DrawFn) -> tuple[list[str], list[tuple[str, str]]]:
    """Mostly acceptable, with every kind of clash now and then: a builder's volume name, an
    unknown volume, a builder's mount path (also spelled with a trailing '/'), two mounts at one."""
    volumes = draw(st.lists(st.sampled_from(["a", "b", "c", "tmp"]), max_size=3, unique=True))
    names = st.sampled_from([*volumes, "shm", "models", "hf-cache", "zz"])
    paths = st.sampled_from(["/a", "/b", "/c", "/d", "/e", "/f", "/tmp", "/models/", "/a/"])
    return volumes, draw(st.lists(st.tuples(names, paths), max_size=3, unique_by=lambda m: m[1]))


@settings(max_examples=200, deadline=None)
@given(
    mode=st.sampled_from(["devicePlugin", "dra"]),
    device=st.sampled_from(["gpu", "cpu"]),
    model_volume=st.booleans(),
    hugging_face=st.booleans(),
    overlay=volumes_and_mounts(),
)
def test_any_accepted_overlay_mounts_only_volumes_the_pod_has_at_distinct_paths(
    mode: str, device: str, model_volume: bool, hugging_face: bool, overlay: tuple[list[str], list[tuple[str, str]]]
) -> None:
    volumes, mounts = overlay
    workload: dict[str, Any] = {"mode": mode, "device": device, "pod": {
        "volumes": [{"name": v, "emptyDir": {}} for v in volumes],
        "volumeMounts": [{"name": n, "mountPath": p} for n, p in mounts]}}  # fmt: skip
    if model_volume:
        workload["modelVolume"] = MODELS_PVC
    if hugging_face:
        workload["huggingFace"] = {}
    try:
        group = parse_group(spec(**workload))
    except SpecError:
        return  # refused, naming the field: the API server never sees it
    pod = deployment(BODY, group)["spec"]["template"]["spec"]
    names = [v["name"] for v in pod["volumes"]]
    assert len(names) == len(set(names))
    for c in pod["containers"]:
        assert {m["name"] for m in c["volumeMounts"]} <= set(names)
        paths = [m["mountPath"].rstrip("/") for m in c["volumeMounts"]]
        assert len(paths) == len(set(paths))


@pytest.mark.parametrize("version", ["1.34", "1.37"])
@pytest.mark.parametrize(
    "workload",
    [{"mode": "devicePlugin"}, {"mode": "dra"}, {"device": "cpu", "pod": OVERLAY},
     {"mode": "dra", "modelVolume": MODELS_PVC, "huggingFace": {"download": True, "tokenSecret": "t"}, "pod": OVERLAY}],
    ids=["devicePlugin", "dra", "cpu-overlay", "dra-overlay-volumes"],
)  # fmt: skip
def test_every_manifest_with_the_workload_fields_is_valid_for_current_kubernetes(
    version: str, workload: dict[str, Any]
) -> None:
    for obj in manifests(BODY, parse_group(spec(offloadBytes="1Gi", **workload))):
        kubernetes_validate.validate(obj, version, strict=True)


@pytest.mark.parametrize(
    "workload",
    [{}, {"mode": "dra"}, {"device": "cpu", "offloadBytes": "1Gi"}, {"adminTokenSecret": "s"}],
    ids=["devicePlugin", "dra", "cpu+tier", "token"],
)
def test_every_argv_the_builders_write_is_one_the_server_and_router_accept(
    workload: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The contract between the operator and the image: a flag the server does not take (a
    missing value, a renamed option) fails every pod at start -- found once only on a real node."""
    from kvpool_operator import builders
    from kvpool_server.cli import parse_settings
    from kvpool_server.flags import parse_flags
    from kvpool_server.router.settings import RouterSettings

    (tmp_path / "token").write_text("mounted")  # where the pod mounts the Secret
    monkeypatch.setattr(builders, "ADMIN_TOKEN_DIR", str(tmp_path))
    group = parse_group(spec(**workload))
    pod = deployment(BODY, group)["spec"]["template"]["spec"]
    for argv, model in zip(server_argvs(pod), group.models, strict=True):
        settings = parse_settings(argv)
        assert settings.served_model_name == model.name
        assert settings.log_json is True
        assert settings.ledger_bytes == group.policy.budget_bytes
        assert settings.admin_port != settings.port
        assert settings.admin_token_source().current() == ("mounted" if "adminTokenSecret" in workload else None)
    router = parse_flags(RouterSettings, router_args(group))
    assert set(router.upstreams()) == {m.name for m in group.models}
