"""Reading the resource's untyped JSON: typed readers whose every error names the field path
(``spec.workload.pod.tolerations[0]: must be an object``), and ``freeze``/``thaw`` between JSON
and the immutable values the frozen spec holds. The bottom of the spec's ladder: ``podspec``
and ``spec`` read with these, nothing here knows the resource's shape."""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

Frozen = Any  # a JSON value with every object a MappingProxyType and every list a tuple


class SpecError(ValueError):
    """The resource's spec is invalid; the message names the field and the fix."""


def freeze(value: Any) -> Frozen:
    """JSON -> the same value, immutable all the way down (a frozen spec stays frozen)."""
    if isinstance(value, Mapping):
        return MappingProxyType({k: freeze(v) for k, v in value.items()})
    if isinstance(value, (list, tuple)):
        return tuple(freeze(v) for v in value)
    return value


def thaw(value: Frozen) -> Any:
    """A frozen value -> fresh JSON (dicts and lists) for a manifest; the spec is never shared."""
    if isinstance(value, Mapping):
        return {k: thaw(v) for k, v in value.items()}
    if isinstance(value, tuple):
        return [thaw(v) for v in value]
    return value


def string(value: Any, path: str) -> str:
    if not isinstance(value, str):
        raise SpecError(f"{path}: must be a string")
    return value


def obj(value: Any, path: str) -> Mapping[str, Frozen]:
    """An object whose content Kubernetes validates itself (affinity, a toleration): passed through."""
    if not isinstance(value, Mapping):
        raise SpecError(f"{path}: must be an object")
    frozen: Mapping[str, Frozen] = freeze(value)
    return frozen


def string_map(value: Any, path: str) -> Mapping[str, str]:
    """An object of strings, such as labels or a node selector (``"true"``, not ``true``)."""
    for key, item in obj(value, path).items():
        string(item, f"{path}.{key}")
    return MappingProxyType(dict(value))


def objects(value: Any, path: str, required: tuple[str, ...] = ()) -> tuple[Mapping[str, Frozen], ...]:
    """A list of objects, each with the ``required`` keys as non-empty strings."""
    if not isinstance(value, list):
        raise SpecError(f"{path}: must be a list")
    out = tuple(obj(item, f"{path}[{i}]") for i, item in enumerate(value))
    for i, item in enumerate(out):
        for key in required:
            if key not in item:
                raise SpecError(f"{path}[{i}].{key} is required")
            if not string(item[key], f"{path}[{i}].{key}"):
                raise SpecError(f"{path}[{i}].{key}: must not be empty")
    return out
