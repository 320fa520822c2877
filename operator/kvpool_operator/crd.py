"""The ``ColocatedModels`` CustomResourceDefinition, built as data (the chart renders it from here).

The schema rejects what it can at admission (required fields, types, ranges, name pattern);
:mod:`kvpool_operator.spec` checks the rest (min <= max, minimums within the budget) and names
the field. Kept within what Kubernetes 1.20 serves (no CEL rules), so it installs on the oldest
API server the tests run against.
"""

from __future__ import annotations

from typing import Any

from kvpool_operator.spec import NAME_RE, QUANTITY_RE

GROUP, VERSION, KIND, PLURAL = "kvpool.dev", "v1alpha1", "ColocatedModels", "colocatedmodels"

# One source for the patterns: what the API server admits, the parser reads.
_BYTES = {"x-kubernetes-int-or-string": True, "pattern": QUANTITY_RE.pattern}


def _model_schema() -> dict[str, Any]:
    return {
        "type": "object",
        "required": ["name", "model", "minBytes", "maxBytes"],
        "properties": {
            "name": {"type": "string", "pattern": NAME_RE.pattern,
                     "description": "DNS label; names the model's Service and container"},
            "model": {"type": "string", "minLength": 1, "description": "model path or id"},
            "minBytes": {**_BYTES, "description": "KV memory this model always keeps"},
            "maxBytes": {**_BYTES, "description": "KV memory this model never exceeds"},
            "weight": {"type": "number", "exclusiveMinimum": True, "minimum": 0,
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
            "models": {"type": "array", "minItems": 1, "items": _model_schema()},
            "workload": {
                "type": "object",
                "properties": {
                    "mode": {
                        "type": "string",
                        "enum": ["devicePlugin", "dra"],
                        "description": "devicePlugin (default): one container holds nvidia.com/gpu: 1 and runs "
                        "every model's server; dra: a shared ResourceClaim (Kubernetes >= 1.34)",
                    },
                    "replicas": {"type": "integer", "minimum": 0, "maximum": 64},
                    "image": {"type": "string", "minLength": 1},
                    "adminTokenSecret": {"type": "string", "description": "Secret with key 'token' for the admin API"},
                    "offloadBytes": {**_BYTES, "description": "CPU offload tier per model"},
                    "deviceClassName": {"type": "string", "description": "DRA DeviceClass (default gpu.nvidia.com)"},
                },
            },
            "rebalance": {
                "type": "object",
                "properties": {
                    "intervalSeconds": {"type": "number", "minimum": 1, "maximum": 3600},
                    "hysteresisBytes": _BYTES,
                    "maxStepBytes": _BYTES,
                },
            },
        },
    }


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


def main() -> None:
    """Print the CRD as YAML (the chart's crds/ file is this output; a test keeps them equal)."""
    import yaml

    print(yaml.safe_dump(build_crd(), sort_keys=False), end="")


if __name__ == "__main__":
    main()
