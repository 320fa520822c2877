"""``spec.workload``'s Kubernetes parts: the pod overlay (``pod``, in PodSpec's own field names
and shapes), the model volume and Hugging Face, parsed into frozen types (``spec`` -> here ->
``fields``); :mod:`kvpool_operator.builders` lays them over the pod it builds.

    workload:
      modelVolume: {persistentVolumeClaim: {claimName: models}}   # read-only at modelMountPath
      modelMountPath: /models
      huggingFace: {download: true, tokenSecret: hf, cacheVolume: {persistentVolumeClaim: {claimName: hf}}}
      pod:
        nodeSelector: {nvidia.com/gpu.product: NVIDIA-H100-80GB-HBM3}
        tolerations: [{key: dedicated, operator: Equal, value: ml, effect: NoSchedule}]
        resources: {requests: {cpu: "8", memory: 64Gi}, limits: {memory: 96Gi}}
        env: [{name: VLLM_LOGGING_LEVEL, value: DEBUG}]

Content that Kubernetes validates itself (an affinity, a toleration, a volume source) passes
through, checked only for its shape. The builder owns some names -- its volumes and their mount
paths, its pods' labels, the GPU resource -- and an overlay that names one is refused here, with
its field path, rather than silently overwritten or left for the API server to refuse the whole
Deployment.
"""

from __future__ import annotations

import posixpath
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from kvpool_operator import fields
from kvpool_operator.fields import Frozen, SpecError

TMP, SHM, MODELS, HF_CACHE, ADMIN_TOKEN = "tmp", "shm", "models", "hf-cache", "admin-token"
BUILDER_VOLUMES = (TMP, SHM, MODELS, HF_CACHE, ADMIN_TOKEN)  # reserved whether or not this pod has them
# the admin token as a file, not an environment variable: the kubelet updates a mounted Secret in
# place, and the servers read the file again when it changes (rotation without a restart)
ADMIN_TOKEN_DIR = "/var/run/kvpool/admin-token"
HF_HOME = "/hf-cache"
_FIXED_MOUNTS = {TMP: "/tmp", SHM: "/dev/shm"}  # in every container
GPU_RESOURCE = "nvidia.com/gpu"
# Common GPU clusters taint their GPU nodes so that only pods asking for a GPU land there.
GPU_TOLERATIONS = (fields.freeze({"key": GPU_RESOURCE, "operator": "Exists", "effect": "NoSchedule"}),)
# builders.labels(): the Services and ServiceMonitors select the pods by them (a test holds the two equal)
BUILDER_LABELS = ("app.kubernetes.io/name", "app.kubernetes.io/instance", "app.kubernetes.io/component",
                  "app.kubernetes.io/managed-by", "kvpool.dev/group")  # fmt: skip
_EMPTY: Mapping[str, Any] = MappingProxyType({})


def _no_keys() -> Any:
    """An empty mappingproxy default: dataclasses refuse it as such (unhashable reads as mutable)."""
    return field(default_factory=lambda: _EMPTY)


_POD = "spec.workload.pod"


@dataclass(frozen=True)
class ModelVolume:
    """``spec.workload.modelVolume``: where the model files are."""

    source: Mapping[str, Frozen]  #: one Volume source, e.g. {persistentVolumeClaim: {claimName: models}}
    mount_path: str = "/models"  #: mounted read-only there in every model container


@dataclass(frozen=True)
class HuggingFace:
    """``spec.workload.huggingFace``: the hub's cache (``HF_HOME``) and, with ``download``, the hub."""

    download: bool = False  #: fetch what the cache lacks; without it HF_HUB_OFFLINE=1 as with no hub at all
    token_secret: str | None = None  #: Secret whose key "token" becomes HF_TOKEN (gated models)
    cache_volume: Mapping[str, Frozen] = field(default_factory=lambda: fields.freeze({"emptyDir": {}}))


@dataclass(frozen=True)
class PodOverlay:
    """``spec.workload.pod``: PodSpec fields over the built pod. Pod-level ones go onto the pod;
    ``env``, ``envFrom``, ``volumeMounts`` and ``resources`` onto every model container (not the
    DRA mode's router)."""

    node_selector: Mapping[str, str] = _no_keys()
    #: the default device is gpu, hence its toleration; cpu pods, or any list given, replace it
    tolerations: tuple[Mapping[str, Frozen], ...] = GPU_TOLERATIONS
    affinity: Mapping[str, Frozen] | None = None
    requests: Mapping[str, str | int] = _no_keys()  #: resources.requests
    limits: Mapping[str, str | int] = _no_keys()  #: resources.limits, merged with the builder's GPU
    image_pull_secrets: tuple[Mapping[str, Frozen], ...] = ()
    priority_class_name: str | None = None
    service_account_name: str | None = None
    env: tuple[Mapping[str, Frozen], ...] = ()  #: appended; one named like a builder's replaces it
    env_from: tuple[Mapping[str, Frozen], ...] = ()
    volumes: tuple[Mapping[str, Frozen], ...] = ()  #: appended to the builder's
    volume_mounts: tuple[Mapping[str, Frozen], ...] = ()
    labels: Mapping[str, str] = _no_keys()  #: onto the pod template, beside the builder's own
    annotations: Mapping[str, str] = _no_keys()


def builder_mounts(
    model_volume: ModelVolume | None, hugging_face: HuggingFace | None, admin_token: bool
) -> dict[str, str]:
    """Volume name -> mount path, of what the builder mounts in a model container."""
    out = dict(_FIXED_MOUNTS)
    if admin_token:
        out[ADMIN_TOKEN] = ADMIN_TOKEN_DIR
    if model_volume is not None:
        out[MODELS] = model_volume.mount_path
    if hugging_face is not None:
        out[HF_CACHE] = HF_HOME
    return out


def volume_source(value: Any, path: str) -> Mapping[str, Frozen]:
    """A Volume without its name: exactly one source (the operator names it)."""
    source = fields.obj(value, path)
    if len(source) != 1:
        raise SpecError(
            f"{path}: give exactly one volume source, e.g. {{persistentVolumeClaim: {{claimName: models}}}}; "
            f"got {sorted(source) or 'none'}"
        )
    (key,) = source
    fields.obj(source[key], f"{path}.{key}")
    return source


def parse_model_volume(workload: Mapping[str, Any]) -> ModelVolume | None:
    if "modelVolume" not in workload:
        if "modelMountPath" in workload:
            raise SpecError("spec.workload.modelMountPath: set spec.workload.modelVolume too (nothing to mount)")
        return None
    source = volume_source(workload["modelVolume"], "spec.workload.modelVolume")
    mount = fields.string(workload.get("modelMountPath", "/models"), "spec.workload.modelMountPath")
    taken = [*_FIXED_MOUNTS.values(), HF_HOME]
    if not mount.startswith("/") or _normal(mount) in ["/", *taken]:
        raise SpecError(f"spec.workload.modelMountPath: {mount!r} must be an absolute path other than / and {taken}")
    return ModelVolume(source, _normal(mount))


def _normal(path: str) -> str:
    """Two spellings of one path are one mount point: '/models/' is '/models'."""
    return posixpath.normpath(path)


def parse_hugging_face(raw: Any) -> HuggingFace | None:
    if raw is None:
        return None
    path = "spec.workload.huggingFace"
    hf = fields.obj(raw, path)
    download = hf.get("download", False)
    if not isinstance(download, bool):
        raise SpecError(f"{path}.download: {download!r} must be true or false")
    token = fields.string(hf.get("tokenSecret", ""), f"{path}.tokenSecret")
    cache = volume_source(hf.get("cacheVolume", {"emptyDir": {}}), f"{path}.cacheVolume")
    return HuggingFace(download, token or None, cache)


def parse_pod(raw: Any, mounts: Mapping[str, str], gpu: bool) -> PodOverlay:
    """``mounts``: the builder's (:func:`builder_mounts`), which the overlay's may not shadow."""
    fields.obj(raw, _POD)
    pod: Mapping[str, Any] = raw  # read as given: each reader checks and freezes its own field
    known = {*_READERS, "volumeMounts"}
    unknown = sorted(set(pod) - known)
    if unknown:
        raise SpecError(f"{_POD}.{unknown[0]}: not a field the overlay sets; use one of {', '.join(sorted(known))}")
    read = {key: reader(pod[key], f"{_POD}.{key}") for key, reader in _READERS.items() if key in pod}
    requests, limits = read.get("resources", (_EMPTY, _EMPTY))
    return PodOverlay(
        node_selector=read.get("nodeSelector", _EMPTY),
        tolerations=read.get("tolerations", GPU_TOLERATIONS if gpu else ()),
        affinity=read.get("affinity"),
        requests=requests,
        limits=limits,
        image_pull_secrets=read.get("imagePullSecrets", ()),
        priority_class_name=read.get("priorityClassName") or None,
        service_account_name=read.get("serviceAccountName") or None,
        env=read.get("env", ()),
        env_from=read.get("envFrom", ()),
        volumes=read.get("volumes", ()),
        volume_mounts=_volume_mounts(pod.get("volumeMounts", []), mounts, read.get("volumes", ())),
        labels=read.get("labels", _EMPTY),
        annotations=read.get("annotations", _EMPTY),
    )


def _named(value: Any, path: str) -> tuple[Mapping[str, Frozen], ...]:
    return fields.objects(value, path, required=("name",))


def _resources(value: Any, path: str) -> tuple[Mapping[str, str | int], Mapping[str, str | int]]:
    resources = fields.obj(value, path)
    for key in resources:
        if key not in ("requests", "limits"):
            raise SpecError(f"{path}.{key}: give requests and limits only (the operator sets the GPU's claim)")
    out = []
    for key in ("requests", "limits"):
        quantities = fields.obj(resources.get(key, {}), f"{path}.{key}")
        for name, q in quantities.items():
            if name == GPU_RESOURCE:
                raise SpecError(f"{path}.{key}.{name}: the operator sets the GPU (spec.workload.device); remove it")
            if isinstance(q, bool) or not isinstance(q, (str, int)):
                raise SpecError(f"{path}.{key}.{name}: {q!r} must be a quantity, e.g. 8, 500m, 64Gi")
        out.append(quantities)
    return out[0], out[1]


def _volumes(value: Any, path: str) -> tuple[Mapping[str, Frozen], ...]:
    volumes = _named(value, path)
    seen: set[str] = set()
    for i, volume in enumerate(volumes):
        name = volume["name"]
        if name in BUILDER_VOLUMES:
            reserved = ", ".join(BUILDER_VOLUMES)
            raise SpecError(f"{path}[{i}].name: {name!r} is the operator's ({reserved} are); rename it")
        if name in seen:
            raise SpecError(f"{path}[{i}].name: {name!r} names two volumes")
        seen.add(name)
    return volumes


def _volume_mounts(
    value: Any, mounts: Mapping[str, str], volumes: tuple[Mapping[str, Frozen], ...]
) -> tuple[Mapping[str, Frozen], ...]:
    """Each names a volume of the pod, at a path nothing else mounts at."""
    path = f"{_POD}.volumeMounts"
    out = fields.objects(value, path, required=("name", "mountPath"))
    names = {*mounts, *(v["name"] for v in volumes)}
    paths = set(mounts.values())
    for i, mount in enumerate(out):
        if mount["name"] not in names:
            raise SpecError(f"{path}[{i}].name: {mount['name']!r} is not a volume of the pod; add it to {_POD}.volumes")
        if _normal(mount["mountPath"]) in paths:
            raise SpecError(f"{path}[{i}].mountPath: {mount['mountPath']!r} is already mounted; choose another path")
        paths.add(_normal(mount["mountPath"]))
    return out


def _labels(value: Any, path: str) -> Mapping[str, str]:
    labels = fields.string_map(value, path)
    for key in labels:
        if key in BUILDER_LABELS:
            raise SpecError(f"{path}.{key}: the operator's own label (its Services select the pods by it)")
    return labels


# spec.workload.pod's fields, each with its reader (volumeMounts is read last: it names volumes)
_READERS: dict[str, Callable[[Any, str], Any]] = {
    "nodeSelector": fields.string_map,
    "tolerations": fields.objects,
    "affinity": fields.obj,
    "resources": _resources,
    "imagePullSecrets": _named,
    "priorityClassName": fields.string,
    "serviceAccountName": fields.string,
    "env": _named,
    "envFrom": fields.objects,
    "volumes": _volumes,
    "labels": _labels,
    "annotations": fields.string_map,
}
