"""Values of a Kubernetes structural schema, as a hypothesis strategy -- the subset the
ColocatedModels CRD uses (object/properties/required, additionalProperties, array with item bounds,
string with pattern or minLength, enum, integer and number bounds, boolean, int-or-string, preserved
unknown fields). hypothesis-jsonschema would do this, but its 0.23 does not run on the Hypothesis we
pin (it reaches into Hypothesis internals that moved)."""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=6,
)
KEYS = st.from_regex(r"[a-z][a-zA-Z0-9]{0,7}", fullmatch=True)


def values(schema: dict[str, Any]) -> st.SearchStrategy[Any]:
    if "enum" in schema:
        return st.sampled_from(schema["enum"])
    if schema.get("x-kubernetes-int-or-string"):
        text = st.from_regex(schema["pattern"], fullmatch=True) if "pattern" in schema else st.text(max_size=8)
        return st.integers(min_value=-(2**40), max_value=2**40) | text
    kind = schema.get("type")
    if kind == "object" or "properties" in schema:
        return _object(schema)
    if kind == "array":
        return st.lists(values(schema.get("items", {})), min_size=schema.get("minItems", 0),
                        max_size=min(schema.get("maxItems", 3), 3))  # fmt: skip
    if kind == "string":
        if "pattern" in schema:
            return st.from_regex(schema["pattern"], fullmatch=True)
        return st.text(min_size=schema.get("minLength", 0), max_size=12)
    if kind == "integer":
        return st.integers(schema.get("minimum", -(2**31)), schema.get("maximum", 2**31))
    if kind == "number":
        low = schema.get("minimum", -1e6)
        return st.floats(low, 1e6, exclude_min=bool(schema.get("exclusiveMinimum")), allow_nan=False)
    if kind == "boolean":
        return st.booleans()
    return JSON  # no type: anything


def _object(schema: dict[str, Any]) -> st.SearchStrategy[Any]:
    props = schema.get("properties", {})
    required = set(schema.get("required", []))
    fixed = st.fixed_dictionaries(
        {k: values(v) for k, v in props.items() if k in required},
        optional={k: values(v) for k, v in props.items() if k not in required},
    )
    extra = schema.get("additionalProperties")
    if schema.get("x-kubernetes-preserve-unknown-fields") or isinstance(extra, dict):
        low, high = schema.get("minProperties", 0), min(schema.get("maxProperties", 3), 3)
        more = st.dictionaries(KEYS, values(extra) if isinstance(extra, dict) else JSON, min_size=low, max_size=high)
        return st.tuples(more, fixed).map(lambda pair: pair[0] | pair[1])
    return fixed
