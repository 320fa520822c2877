"""The written contract of the admin API: ``docs/api/*.schema.json`` is exactly what the result
types generate, the standalone pool's replies validate against it, a snapshot survives the wire
(``to_dict`` -> JSON -> ``from_dict``), and a reader refuses a schema version it does not know."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest

from kvpool import ConfigError, DemandStats, KVPool, PoolSnapshot, ResizeResult, TrimResult
from kvpool.api_schema import render, schemas
from tests.kvpool.factories import MiB, make_config

DOCS = Path(__file__).parents[2] / "docs" / "api"


def validate(name: str, body: object) -> None:
    jsonschema.validate(body, json.loads((DOCS / f"{name}.schema.json").read_text()))


def test_the_published_schemas_are_what_the_types_generate() -> None:
    for name, schema in schemas().items():
        assert (DOCS / f"{name}.schema.json").read_text() == render(schema), f"run python -m kvpool.api_schema {DOCS}"


def test_the_pools_replies_validate_and_survive_the_wire() -> None:
    pool = KVPool(make_config())
    try:
        blocks = pool.allocate(40).blocks
        resize = pool.resize(4 * MiB, 1)
        pool.free(blocks, cache=True)
        trim = pool.trim()
        snap = pool.snapshot()
        wire = json.loads(json.dumps(snap.to_dict()))
        validate("snapshot", wire)
        validate("resize", resize.to_dict())
        validate("trim", trim.to_dict())
        assert wire["physical_bytes"] == snap.mapped_bytes + snap.reserve_bytes
        assert PoolSnapshot.from_dict(wire) == snap
        assert ResizeResult.from_dict(json.loads(json.dumps(resize.to_dict()))) == resize
        assert TrimResult.from_dict(trim.to_dict()) == trim
        with_demand = PoolSnapshot(**{**snap.__dict__, "demand": DemandStats(3, 2, 1)})
        validate("snapshot", with_demand.to_dict())
        assert PoolSnapshot.from_dict(with_demand.to_dict()) == with_demand
    finally:
        pool.close()


def test_a_snapshot_of_another_schema_version_is_refused() -> None:
    pool = KVPool(make_config())
    try:
        wire = pool.snapshot().to_dict()
    finally:
        pool.close()
    with pytest.raises(ConfigError, match="schema_version 2"):
        PoolSnapshot.from_dict({**wire, "schema_version": 2})
    with pytest.raises(jsonschema.ValidationError):
        validate("snapshot", {**wire, "schema_version": 2})
