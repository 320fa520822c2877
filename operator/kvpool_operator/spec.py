"""The ``ColocatedModels`` custom resource's spec (``kvpool.dev/v1alpha1``), parsed and validated
into the policy's types. Every error names the field path and what to change, so the handler can
raise it as a ``kopf.PermanentError`` unchanged.

    spec:
      gpuMemoryBudgetBytes: 40Gi          # all the group's KV pools together
      rebalance: {intervalSeconds: 1, hysteresisBytes: 256Mi, maxStepBytes: 4Gi, policy: demand, minDwellSeconds: 8}
      models:
        - {name: llama, model: /models/llama-3.1-8b, minBytes: 4Gi, maxBytes: 30Gi, weight: 2}
        - {name: qwen,  model: /models/qwen-7b,      minBytes: 4Gi, maxBytes: 30Gi}
      workload:                           # optional; these are the defaults
        mode: devicePlugin                # or dra (Kubernetes >= 1.34 with the NVIDIA DRA driver)
        device: gpu                       # or cpu: --backend host, no GPU (devicePlugin mode only)
        replicas: 1                       # pods, one GPU each; every pod is balanced on its own
        image: ghcr.io/kvpool/kvpool:0.1.0  # -cpu appended for device cpu
        adminTokenSecret: ""              # Secret (key "token") guarding the servers' admin API
        offloadBytes: 0                   # CPU tier per model (a memory-backed /dev/shm that large)
        modelVolume: {persistentVolumeClaim: {claimName: models}}  # none by default
        modelMountPath: /models           # where modelVolume is mounted, read-only
        huggingFace: {download: false, tokenSecret: "", cacheVolume: {emptyDir: {}}}  # none by default
        pod: {}                           # PodSpec fields laid over the pod (kvpool_operator.podspec);
                                          # with device gpu and no tolerations: nvidia.com/gpu tolerated

Without ``huggingFace`` (or with ``download: false``) the servers run with ``HF_HUB_OFFLINE=1``:
``models[].model`` is a path, from ``modelVolume`` or the image.
"""

from __future__ import annotations

import enum
import math
import re
from dataclasses import dataclass, field
from typing import Any, TypeVar

from kvpool_operator import podspec
from kvpool_operator.fields import SpecError as SpecError  # raised here, imported from here by the handlers
from kvpool_operator.podspec import HuggingFace, ModelVolume, PodOverlay
from kvpool_operator.policy import Arbitration, GroupPolicy, ModelBudget

# each model takes ports 8000 + i and 8100 + i; the chart's NetworkPolicy lists the OpenAI ones
MAX_MODELS = 16
MAX_WEIGHT = 1_000_000  #: a model's weight is at most this (the policies multiply bytes by it)
# spec.rebalance.intervalSeconds and minDwellSeconds (in intervals) by default: what every table of the
# colocation benchmark measured (1 s, 8 s). The demand policy counts in rounds (a grant waits for two
# short ones), so the round's length is its reaction time: side by side on alternating 12-s bursts
# (stop 52), p99 TTFT was 0.25x a static split's at 1 s, 0.79x at 2 s and 1.36x -- worse than static
# -- at the 10 s this default used to be. The price: one status write per group a second.
INTERVAL_S = 1
DWELL_ROUNDS = 8
HYSTERESIS_BYTES, MAX_STEP_BYTES = 64 << 20, 1 << 30  #: spec.rebalance's hysteresisBytes and maxStepBytes by default

_UNITS = {"": 1, "Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30, "Ti": 1 << 40, "K": 10**3, "M": 10**6, "G": 10**9}
QUANTITY_RE = re.compile(r"^([0-9]+)(Ki|Mi|Gi|Ti|K|M|G)?$")
NAME_RE = re.compile(r"^[a-z0-9]([-a-z0-9]{0,38}[a-z0-9])?$")
E = TypeVar("E", bound=enum.Enum)


@dataclass(frozen=True)
class ModelSpec:
    name: str
    model: str
    args: tuple[str, ...]


class Mode(enum.Enum):
    """How the group's pod gets its one GPU."""

    DEVICE_PLUGIN = "devicePlugin"  #: one container requests nvidia.com/gpu: 1 and runs every server
    DRA = "dra"  #: one ResourceClaim shared by one container per model (Kubernetes >= 1.34)


class Device(enum.Enum):
    """What the model servers compute on."""

    GPU = "gpu"  #: --backend cuda (CUDA graphs on), one GPU per pod
    CPU = "cpu"  #: --backend host, no GPU requested; the image's CPU build (tag suffix -cpu)


DEFAULT_IMAGE = "ghcr.io/kvpool/kvpool:0.1.0"
CPU_IMAGE_SUFFIX = "-cpu"  # the image's CPU target is published as <tag>-cpu (the chart does the same)


@dataclass(frozen=True)
class Workload:
    mode: Mode = Mode.DEVICE_PLUGIN
    device: Device = Device.GPU
    replicas: int = 1
    image: str = DEFAULT_IMAGE  #: default: DEFAULT_IMAGE, with CPU_IMAGE_SUFFIX for device cpu
    admin_token_secret: str = ""
    offload_bytes: int = 0
    device_class: str = "gpu.nvidia.com"
    model_volume: ModelVolume | None = None  #: none: model paths are in the image (or downloaded)
    hugging_face: HuggingFace | None = None  #: none: no hub cache volume, HF_HUB_OFFLINE=1
    pod: PodOverlay = field(default_factory=PodOverlay)


@dataclass(frozen=True)
class GroupSpec:
    policy: GroupPolicy
    models: tuple[ModelSpec, ...]
    interval_s: float
    workload: Workload = field(default_factory=Workload)


def quantity(value: Any, path: str) -> int:
    """A byte count: an integer or a Kubernetes quantity string ('40Gi', '512Mi'). The server reads
    its flags with the same grammar (``kvpool.units``; a test holds the two equal)."""
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    match = QUANTITY_RE.match(str(value)) if isinstance(value, str) else None
    if match is None:
        raise SpecError(f"{path}: {value!r} is not a byte quantity; use an integer or e.g. 512Mi, 40Gi")
    return int(match.group(1)) * _UNITS[match.group(2) or ""]


def parse_group(spec: dict[str, Any]) -> GroupSpec:
    """Validate a ColocatedModels spec; raises SpecError naming the first bad field."""
    budget = quantity(_required(spec, "gpuMemoryBudgetBytes", "spec"), "spec.gpuMemoryBudgetBytes")
    raw_models = _required(spec, "models", "spec")
    if not isinstance(raw_models, list) or not raw_models:
        raise SpecError("spec.models: list at least one model")
    if len(raw_models) > MAX_MODELS:
        raise SpecError(f"spec.models: at most {MAX_MODELS} models share one pod, got {len(raw_models)}")
    budgets, models = [], []
    for i, raw in enumerate(raw_models):
        budget_i, model_i = _model(raw, f"spec.models[{i}]")
        budgets.append(budget_i)
        models.append(model_i)
    names = [m.name for m in models]
    if len(set(names)) != len(names):
        raise SpecError(f"spec.models: names must be unique, got {names}")
    reb = spec.get("rebalance") or {}
    if not isinstance(reb, dict):
        raise SpecError("spec.rebalance: must be an object (intervalSeconds, hysteresisBytes, maxStepBytes, ...)")
    interval = reb.get("intervalSeconds", INTERVAL_S)
    if not isinstance(interval, (int, float)) or isinstance(interval, bool) or not 1 <= interval <= 3600:
        raise SpecError(f"spec.rebalance.intervalSeconds: {interval!r} must be a number of seconds in 1..3600")
    policy = GroupPolicy(
        budget_bytes=budget,
        models=tuple(budgets),
        hysteresis_bytes=quantity(reb.get("hysteresisBytes", HYSTERESIS_BYTES), "spec.rebalance.hysteresisBytes"),
        max_step_bytes=max(1, quantity(reb.get("maxStepBytes", MAX_STEP_BYTES), "spec.rebalance.maxStepBytes")),
        dwell_rounds=_dwell_rounds(reb.get("minDwellSeconds", DWELL_ROUNDS * interval), interval),
        arbitration=_arbitration(reb.get("policy", Arbitration.DEMAND.value)),
    )
    floor = sum(b.min_bytes for b in budgets)
    if floor > budget:
        raise SpecError(
            f"spec.models[*].minBytes add up to {floor} bytes, more than spec.gpuMemoryBudgetBytes ({budget}): "
            "lower a minimum or raise the budget"
        )
    return GroupSpec(policy, tuple(models), float(interval), _workload(spec.get("workload") or {}))


def _dwell_rounds(dwell: Any, interval: float) -> int:
    if not isinstance(dwell, (int, float)) or isinstance(dwell, bool) or not 0 <= dwell <= 86400:
        raise SpecError(f"spec.rebalance.minDwellSeconds: {dwell!r} must be a number of seconds in 0..86400")
    return math.ceil(dwell / interval)


def _arbitration(name: Any) -> Arbitration:
    try:
        return Arbitration(name)
    except ValueError:
        choices = ", ".join(a.value for a in Arbitration)
        raise SpecError(f"spec.rebalance.policy: {name!r} is not a policy; use one of {choices}") from None


def _workload(raw: Any) -> Workload:
    if not isinstance(raw, dict):
        raise SpecError("spec.workload: must be an object")
    mode, device = _choice(Mode, raw, "mode", Mode.DEVICE_PLUGIN), _choice(Device, raw, "device", Device.GPU)
    if mode is Mode.DRA and device is Device.CPU:
        raise SpecError("spec.workload.device: cpu needs mode devicePlugin (dra mode shares a claimed GPU)")
    replicas = raw.get("replicas", 1)
    if not isinstance(replicas, int) or isinstance(replicas, bool) or not 0 <= replicas <= 64:
        raise SpecError(f"spec.workload.replicas: {replicas!r} must be an integer in 0..64")
    default_image = DEFAULT_IMAGE + (CPU_IMAGE_SUFFIX if device is Device.CPU else "")
    image = raw.get("image", default_image)
    secret = raw.get("adminTokenSecret", "")
    for key, value in (
        ("image", image),
        ("adminTokenSecret", secret),
        ("deviceClassName", raw.get("deviceClassName", "")),
    ):
        if not isinstance(value, str):
            raise SpecError(f"spec.workload.{key}: must be a string")
    if not image:
        raise SpecError("spec.workload.image: give the kvpool image to run")
    model_volume = podspec.parse_model_volume(raw)
    hugging_face = podspec.parse_hugging_face(raw.get("huggingFace"))
    mounts = podspec.builder_mounts(model_volume, hugging_face, admin_token=bool(secret))
    return Workload(
        mode=mode, device=device, replicas=replicas, image=image, admin_token_secret=secret,
        offload_bytes=quantity(raw.get("offloadBytes", 0), "spec.workload.offloadBytes"),
        device_class=raw.get("deviceClassName") or "gpu.nvidia.com",
        model_volume=model_volume, hugging_face=hugging_face,
        pod=podspec.parse_pod(raw.get("pod", {}), mounts, gpu=device is Device.GPU),
    )  # fmt: skip


def _choice(kind: type[E], raw: dict[str, Any], key: str, default: E) -> E:
    try:
        return kind(raw.get(key, default.value))
    except ValueError:
        choices = " or ".join(str(member.value) for member in kind)
        raise SpecError(f"spec.workload.{key}: {raw.get(key)!r} must be {choices}") from None


def _model(raw: Any, path: str) -> tuple[ModelBudget, ModelSpec]:
    if not isinstance(raw, dict):
        raise SpecError(f"{path}: must be an object with name, model, minBytes, maxBytes")
    name = _required(raw, "name", path)
    if not isinstance(name, str) or not NAME_RE.match(name):
        raise SpecError(f"{path}.name: {name!r} must be a DNS label (lower case, digits, '-'; at most 40)")
    model = _required(raw, "model", path)
    if not isinstance(model, str) or not model:
        raise SpecError(f"{path}.model: give a model path or id")
    lo = quantity(_required(raw, "minBytes", path), f"{path}.minBytes")
    hi = quantity(_required(raw, "maxBytes", path), f"{path}.maxBytes")
    if lo > hi:
        raise SpecError(f"{path}: minBytes ({lo}) must not exceed maxBytes ({hi})")
    weight = raw.get("weight", 1)
    # bounded: the policies multiply bytes by weights and sum them, and a weight near the float
    # maximum made the start-up split inf/inf (a crash building the Deployment)
    if not isinstance(weight, (int, float)) or isinstance(weight, bool) or not 0 < weight <= MAX_WEIGHT:
        raise SpecError(f"{path}.weight: {weight!r} must be a positive number up to {MAX_WEIGHT}")
    args = raw.get("args", [])
    if not isinstance(args, list) or not all(isinstance(a, str) for a in args):
        raise SpecError(f"{path}.args: must be a list of strings (extra kvpool-server flags)")
    return ModelBudget(name, lo, hi, float(weight)), ModelSpec(name, model, tuple(args))


def _required(obj: dict[str, Any], key: str, path: str) -> Any:
    if key not in obj:
        raise SpecError(f"{path}.{key} is required")
    return obj[key]
