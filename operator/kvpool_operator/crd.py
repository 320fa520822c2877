"""The ``ColocatedModels`` CustomResourceDefinition, built as data (the chart renders it from here).

The schema rejects what it can at admission (required fields, types, ranges, name pattern);
:mod:`kvpool_operator.spec` checks the rest (min <= max, minimums within the budget) and names
the field. Kept within what Kubernetes 1.20 serves (no CEL rules), so it installs on the oldest
API server the tests run against. PodSpec content in ``workload.pod`` (an affinity, a toleration,
a volume source, an env entry) is an object whose unknown fields are kept
(``x-kubernetes-preserve-unknown-fields``): the API server validates it when the operator applies
the Deployment, and copying PodSpec's whole schema here would pin it to one Kubernetes version.
"""

from __future__ import annotations

from typing import Any

from kvpool_operator.policy import Arbitration
from kvpool_operator.spec import (
    DWELL_ROUNDS,
    HYSTERESIS_BYTES,
    INTERVAL_S,
    MAX_MODELS,
    MAX_STEP_BYTES,
    MAX_WEIGHT,
    NAME_RE,
    QUANTITY_RE,
)

GROUP, VERSION, KIND, PLURAL = "kvpool.dev", "v1alpha1", "ColocatedModels", "colocatedmodels"

# One source for the patterns: what the API server admits, the parser reads.
_BYTES = {"x-kubernetes-int-or-string": True, "pattern": QUANTITY_RE.pattern}
_STRING_MAP = {"type": "object", "additionalProperties": {"type": "string"}}
_QUANTITY_MAP = {"type": "object", "additionalProperties": {"x-kubernetes-int-or-string": True}}  # 8, 500m, 64Gi
_ANY = {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
_VOLUME_SOURCE = {**_ANY, "minProperties": 1, "maxProperties": 1,
                  "description": "one Volume source, e.g. {persistentVolumeClaim: {claimName: models}}"}  # fmt: skip


def _objects(*required: str) -> dict[str, Any]:
    """A list of PodSpec objects (passed through), each with ``required`` non-empty strings."""
    item: dict[str, Any] = dict(_ANY)
    if required:
        item |= {"required": list(required), "properties": {k: {"type": "string", "minLength": 1} for k in required}}
    return {"type": "array", "items": item}


def _pod_schema() -> dict[str, Any]:
    return {
        "type": "object",
        "description": "PodSpec fields laid over the group's pods; env, envFrom, volumeMounts and resources go "
        "to the model containers",
        "properties": {
            "nodeSelector": _STRING_MAP,
            "tolerations": {**_objects(), "description": "default with device gpu: tolerate nvidia.com/gpu"},
            "affinity": _ANY,
            "resources": {"type": "object", "properties": {"requests": _QUANTITY_MAP, "limits": _QUANTITY_MAP}},
            "imagePullSecrets": _objects("name"),
            "priorityClassName": {"type": "string"},
            "serviceAccountName": {"type": "string"},
            "env": _objects("name"),
            "envFrom": _objects(),
            "volumes": _objects("name"),
            "volumeMounts": _objects("name", "mountPath"),
            "labels": _STRING_MAP,
            "annotations": _STRING_MAP,
        },
    }


def _workload_schema() -> dict[str, Any]:
    hugging_face = {
        "type": "object",
        "properties": {
            "download": {"type": "boolean", "description": "fetch missing models (default false: HF_HUB_OFFLINE=1)"},
            "tokenSecret": {"type": "string", "description": "Secret with key 'token' for HF_TOKEN"},
            "cacheVolume": {**_VOLUME_SOURCE, "description": "HF_HOME, at /hf-cache (default emptyDir)"},
        },
    }
    return {
        "type": "object",
        "properties": {
            "mode": {
                "type": "string",
                "enum": ["devicePlugin", "dra"],
                "description": "devicePlugin (default): one container holds nvidia.com/gpu: 1 and runs "
                "every model's server; dra: a shared ResourceClaim (Kubernetes >= 1.34)",
            },
            "device": {"type": "string", "enum": ["gpu", "cpu"],
                       "description": "gpu (default) or cpu: --backend host, no GPU, devicePlugin mode only"},
            "replicas": {"type": "integer", "minimum": 0, "maximum": 64},
            "image": {"type": "string", "minLength": 1},
            "adminTokenSecret": {"type": "string", "description": "Secret with key 'token' for the admin API"},
            "offloadBytes": {**_BYTES, "description": "CPU offload tier per model"},
            "deviceClassName": {"type": "string", "description": "DRA DeviceClass (default gpu.nvidia.com)"},
            "modelVolume": {**_VOLUME_SOURCE, "description": "the models' volume, mounted read-only"},
            "modelMountPath": {"type": "string", "pattern": "^/", "description": "default /models"},
            "huggingFace": hugging_face,
            "pod": _pod_schema(),
        },
    }  # fmt: skip


def _model_schema() -> dict[str, Any]:
    return {
        "type": "object",
        "required": ["name", "model", "minBytes", "maxBytes"],
        "properties": {
            "name": {"type": "string", "pattern": NAME_RE.pattern,
                     "description": "DNS label; names the model's Service and container"},
            "model": {"type": "string", "minLength": 1,
                      "description": "model path or Hugging Face id; tiny: the embedded random test model"},
            "minBytes": {**_BYTES, "description": "KV memory this model always keeps"},
            "maxBytes": {**_BYTES, "description": "KV memory this model never exceeds"},
            "weight": {"type": "number", "exclusiveMinimum": True, "minimum": 0, "maximum": MAX_WEIGHT,
                       "description": "share of the memory above the minimums, times demand (default 1)"},
            "args": {"type": "array", "items": {"type": "string"}, "description": "extra kvpool-server flags"},
        },
    }  # fmt: skip


def _spec_schema() -> dict[str, Any]:
    return {
        "type": "object",
        "required": ["gpuMemoryBudgetBytes", "models"],
        "properties": {
            "gpuMemoryBudgetBytes": {**_BYTES, "description": "GPU memory all the group's KV pools may use"},
            "models": {"type": "array", "minItems": 1, "maxItems": MAX_MODELS, "items": _model_schema()},
            "workload": _workload_schema(),
            "rebalance": _rebalance_schema(),
        },
    }


def _rebalance_schema() -> dict[str, Any]:
    mib, gib = 1 << 20, 1 << 30
    return {
        "type": "object",
        "description": "how the operator moves memory between the group's models, one round every interval",
        "properties": {
            "intervalSeconds": {"type": "number", "minimum": 1, "maximum": 3600,
                                "description": f"seconds between rounds (default {INTERVAL_S}); the demand policy "
                                "grants a model short of memory for two rounds in a row, a burst at once"},
            "hysteresisBytes": {**_BYTES, "description": "the smallest move worth a resize "
                                f"(default {HYSTERESIS_BYTES // mib}Mi)"},
            "maxStepBytes": {**_BYTES, "description": f"the most one move gives (default {MAX_STEP_BYTES // gib}Gi)"},
            "minDwellSeconds": {"type": "number", "minimum": 0, "maximum": 86400,
                                "description": "demand policy: a grant is held this long unless the load left, and "
                                "a model keeps the peak of its use over it (default "
                                f"{DWELL_ROUNDS} intervals)"},
            "policy": {"type": "string", "enum": [a.value for a in Arbitration],
                       "description": "demand (default): memory moves only to a model it hurts now; proportional: "
                       "every limit toward a share by weight x utilisation"},
        },
    }  # fmt: skip


def build_crd() -> dict[str, Any]:
    columns = [
        ("Budget", "string", ".spec.gpuMemoryBudgetBytes"),
        ("Ready", "string", '.status.conditions[?(@.type=="Ready")].status'),
        ("Balanced", "string", '.status.conditions[?(@.type=="Balanced")].status'),
        ("Degraded", "string", '.status.conditions[?(@.type=="Degraded")].status'),
        ("Age", "date", ".metadata.creationTimestamp"),
    ]
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{PLURAL}.{GROUP}"},
        "spec": {
            "group": GROUP,
            "scope": "Namespaced",
            "names": {"kind": KIND, "plural": PLURAL, "singular": "colocatedmodels", "shortNames": ["kvgroup"]},
            "versions": [
                {
                    "name": VERSION,
                    "served": True,
                    "storage": True,
                    "subresources": {"status": {}},
                    "additionalPrinterColumns": [{"name": n, "type": t, "jsonPath": p} for n, t, p in columns],
                    "schema": {
                        "openAPIV3Schema": {
                            "type": "object",
                            "properties": {
                                "spec": _spec_schema(),
                                "status": {"type": "object", "x-kubernetes-preserve-unknown-fields": True},
                            },
                        }
                    },
                }
            ],
        },
    }


def _json_schema(node: dict[str, Any]) -> dict[str, Any]:
    """The CRD's OpenAPI v3 schema as the JSON Schema Helm checks values with: byte fields become
    the ``bytes`` definition (other int-or-string ones, integer or string), objects refuse unknown
    keys (a typo names its key at ``helm install``) unless they pass PodSpec content through,
    1.20's boolean ``exclusiveMinimum`` becomes the numeric one."""
    if node.get("x-kubernetes-int-or-string"):
        is_bytes = node.get("pattern") == QUANTITY_RE.pattern
        return {"$ref": "#/definitions/bytes"} if is_bytes else {"type": ["integer", "string"]}
    nested = ("properties", "items", "additionalProperties")
    out = {k: v for k, v in node.items() if k not in ("description", "exclusiveMinimum", *nested)
           and not k.startswith("x-kubernetes-")}  # fmt: skip
    if node.get("exclusiveMinimum") is True:
        out["exclusiveMinimum"] = out.pop("minimum")
    if node.get("enum"):
        out.pop("type", None)
    if "properties" in node:
        if not node.get("x-kubernetes-preserve-unknown-fields"):
            out["additionalProperties"] = False
        out["properties"] = {k: _json_schema(v) for k, v in node["properties"].items()}
    for key in ("items", "additionalProperties"):
        if key in node:
            out[key] = _json_schema(node[key])
    return out


def values_schema_groups() -> dict[str, Any]:
    """``values.schema.json``'s ``groups`` (each entry: a name and a ColocatedModels spec) and its
    ``bytes`` definition, from the CRD's own schema: one source, kept equal by a test."""
    group = _json_schema(_spec_schema())
    group["required"] = ["name", *group["required"]]
    group["properties"] = {"name": {"type": "string", "pattern": NAME_RE.pattern}, **group["properties"]}
    bytes_ = {"oneOf": [{"type": "integer", "minimum": 0}, {"type": "string", "pattern": QUANTITY_RE.pattern}]}
    return {"groups": {"type": "array", "items": group}, "bytes": bytes_}


def write_values_schema(path: str) -> None:
    """Put the generated ``groups`` and ``bytes`` into the chart's values schema (the rest stays)."""
    import json

    with open(path) as f:
        schema = json.load(f)
    generated = values_schema_groups()
    schema["properties"]["groups"] = generated["groups"]
    schema.setdefault("definitions", {})["bytes"] = generated["bytes"]
    with open(path, "w") as f:
        f.write(json.dumps(schema, indent=2) + "\n")


def main(argv: list[str] | None = None) -> None:
    """Print the CRD as YAML (the chart's crds/ file is this output; a test keeps them equal), or
    with ``--values-schema PATH`` regenerate the chart's values schema for groups."""
    import argparse

    import yaml

    p = argparse.ArgumentParser(prog="python -m kvpool_operator.crd")
    p.add_argument("--values-schema", metavar="PATH", help="rewrite the groups part of this values.schema.json")
    args = p.parse_args(argv)
    if args.values_schema:
        write_values_schema(args.values_schema)
        return
    print(yaml.safe_dump(build_crd(), sort_keys=False), end="")


if __name__ == "__main__":
    main()
