"""The operator's side of the admin-API contract: every key it reads is in the published JSON
Schemas with the type it expects, it reads a real pool's snapshot, and it refuses a snapshot of
another schema version or one without a key it needs (the round marks the group Degraded rather
than move memory on fields whose meaning changed)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from kvpool_operator.wire import READS, SCHEMA_VERSION, PoolState, ResizeReply, WireError

from kvpool import DemandStats, KVPool, PoolSnapshot
from tests.kvpool.factories import MiB, make_config

DOCS = Path(__file__).parents[2] / "docs" / "api"


def resolve(schema: dict[str, Any], path: str) -> dict[str, Any]:
    node = schema
    for part in path.split("."):
        if "oneOf" in node:  # an optional object: the non-null branch
            node = next(o for o in node["oneOf"] if o.get("type") != "null")
        assert part in node["required"], f"{path}: {part} is not required by the schema"
        node = node["properties"][part]
    return node


@pytest.mark.parametrize("reply", sorted(READS))
def test_every_key_the_operator_reads_is_published_with_a_readable_type(reply: str) -> None:
    schema = json.loads((DOCS / f"{reply}.schema.json").read_text())
    for path in READS[reply]:
        node = resolve(schema, path)
        assert node.get("type") == "integer" or "enum" in node or "const" in node, (path, node)
    assert resolve(json.loads((DOCS / "snapshot.schema.json").read_text()), "schema_version") == {
        "const": SCHEMA_VERSION
    }


def real_snapshot() -> dict[str, Any]:
    pool = KVPool(make_config())
    try:
        pool.allocate(10)
        pool.resize(8 * MiB, 4)
        snap = pool.snapshot()
    finally:
        pool.close()
    out: dict[str, Any] = PoolSnapshot(**{**snap.__dict__, "demand": DemandStats(2, 5, 1, 9)}).to_dict()
    return out


def test_a_real_pools_snapshot_reads_into_the_operators_view() -> None:
    wire = real_snapshot()
    state = PoolState.from_json(wire)
    assert (state.limit_bytes, state.revision, state.status) == (8 * MiB, 4, "applied")
    assert state.physical_bytes == wire["mapped_bytes"] + wire["reserve_bytes"]
    assert state.used_bytes == 10 * wire["block_bytes"]
    assert (state.running_requests, state.waiting_requests, state.preemptions) == (2, 5, 1)
    assert state.finished_requests == 9


def test_preemptions_the_pool_made_for_a_shrink_are_not_read_as_a_lack_of_memory() -> None:
    wire = {**real_snapshot(), "demand": {"running_requests": 2, "waiting_requests": 5, "preemptions": 7},
            "shrink_preemptions": 4}  # fmt: skip
    assert PoolState.from_json(wire).preemptions == 3


@pytest.mark.parametrize(
    ("change", "message"),
    [({"schema_version": 2}, "schema_version 2"), ({"physical_bytes": None}, "physical_bytes"),
     ({"pending": {}}, "revision")],
)  # fmt: skip
def test_snapshots_it_cannot_trust_are_refused(change: dict[str, Any], message: str) -> None:
    wire = {**real_snapshot(), **change}
    if change.get("physical_bytes", 0) is None:
        del wire["physical_bytes"]
    with pytest.raises(WireError, match=message):
        PoolState.from_json(wire)


def test_resize_replies_are_read_and_unknown_statuses_refused() -> None:
    ok = {"status": "deferred", "revision": 3, "effective_limit_bytes": MiB, "physical_bytes": 2 * MiB}
    assert ResizeReply.from_json(ok) == ResizeReply("deferred", 3, MiB, 2 * MiB)
    with pytest.raises(WireError, match="exploded"):
        ResizeReply.from_json({**ok, "status": "exploded"})
    with pytest.raises(WireError, match="physical_bytes"):
        ResizeReply.from_json({k: v for k, v in ok.items() if k != "physical_bytes"})
