"""JSON Schemas of the pool's replies, generated from the result types themselves (so the
written contract cannot drift from the code): ``python -m kvpool.api_schema docs/api`` writes
``snapshot.schema.json`` (``GET /kvpool``), ``resize.schema.json`` (``PUT /kvpool/limit``) and
``trim.schema.json`` (``POST /kvpool/trim``); a test keeps the files equal to this output and
checks every reply of a real server against them."""

from __future__ import annotations

import dataclasses
import enum
import json
import sys
import types
import typing
from pathlib import Path
from typing import Any

from kvpool.snapshot import SCHEMA_VERSION, PoolSnapshot, ResizeResult, TrimResult

REPLIES: dict[str, type[Any]] = {"snapshot": PoolSnapshot, "resize": ResizeResult, "trim": TrimResult}


def _type(t: Any) -> dict[str, Any]:
    if typing.get_origin(t) in (typing.Union, types.UnionType):
        return {"oneOf": [_type(a) for a in typing.get_args(t)]}
    if t is type(None):
        return {"type": "null"}
    if typing.get_origin(t) is dict:
        return {"type": "object", "additionalProperties": _type(typing.get_args(t)[1])}
    if isinstance(t, type) and issubclass(t, enum.Enum):
        return {"enum": [m.value for m in t]}
    if isinstance(t, type) and dataclasses.is_dataclass(t):
        return schema_of(t)
    return {"type": {int: "integer", str: "string", bool: "boolean", float: "number"}[t]}


def schema_of(cls: type[Any]) -> dict[str, Any]:
    """An object schema: every field required (an absent tier or demand is ``null``), no others
    but the derived ones (``DERIVED``), whose docs come from the class."""
    hints = typing.get_type_hints(cls)
    props = {f.name: _type(hints[f.name]) for f in dataclasses.fields(cls)}
    for name in getattr(cls, "DERIVED", ()):
        props[name] = {"type": "integer"}
    out: dict[str, Any] = {"type": "object", "title": cls.__name__, "description": (cls.__doc__ or "").strip(),
                           "properties": props, "required": sorted(props), "additionalProperties": False}  # fmt: skip
    if "schema_version" in props:
        out["properties"]["schema_version"] = {"const": SCHEMA_VERSION}
    return out


def schemas() -> dict[str, dict[str, Any]]:
    return {name: {"$schema": "https://json-schema.org/draft/2020-12/schema", **schema_of(cls)}
            for name, cls in REPLIES.items()}  # fmt: skip


def render(schema: dict[str, Any]) -> str:
    return json.dumps(schema, indent=2) + "\n"


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    out = Path(args[0] if args else "docs/api")
    out.mkdir(parents=True, exist_ok=True)
    for name, schema in schemas().items():
        (out / f"{name}.schema.json").write_text(render(schema))


if __name__ == "__main__":
    main()
