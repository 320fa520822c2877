"""The real server over HTTP: the official openai client works, the admin API keeps its contract
(every reply valid against the published JSON Schemas in docs/api, revisions, tokens, clear 4xx
errors that change nothing), /metrics carries vLLM's series and
every kvpool_* series docs name, moving with load and resizes, and a bounded concurrent
load survives a limit cut without losing a request or a block."""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import socket
import time
from pathlib import Path
from typing import Any

import httpx
import jsonschema
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.server.conftest import API_KEY, TOKEN, Server

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

MiB = 1 << 20
MODEL = "tiny"
DESIGN_METRICS = [
    "kvpool_limit_bytes", "kvpool_mapped_bytes", "kvpool_virtual_bytes", "kvpool_reserve_bytes", "kvpool_blocks",
    "kvpool_resize_seconds", "kvpool_resize", "kvpool_offload_bytes", "kvpool_offload_hits",
    "kvpool_offload_misses", "kvpool_demoted_blocks", "kvpool_shrink_preemptions",
]  # fmt: skip
_revision = itertools.count(100)
API_DOCS = Path(__file__).parents[2] / "docs" / "api"


def conforms(reply: str, body: Any) -> Any:
    """``body``, after checking it against the published schema of ``reply``."""
    jsonschema.validate(body, json.loads((API_DOCS / f"{reply}.schema.json").read_text()))
    return body


def openai_client(server: Server) -> Any:
    import openai

    return openai.OpenAI(base_url=server.url + "/v1", api_key=API_KEY)


def metrics(server: Server) -> dict[str, Any]:
    text = httpx.get(server.url + "/metrics", timeout=30).text
    return {f.name: f for f in text_string_to_metric_families(text)}


def sample(families: dict[str, Any], family: str, sample_name: str | None = None, **labels: str) -> float:
    for s in families[family].samples:
        if s.name == (sample_name or family) and all(s.labels.get(k) == v for k, v in labels.items()):
            return float(s.value)
    raise KeyError((family, sample_name, labels))


def test_the_openai_client_completes_chats_streams_and_lists_models(server: Server) -> None:
    # The tiny model has random weights: without ignore_eos it may sample EOS early, so every call
    # pins the length it asserts.
    client = openai_client(server)
    fixed = {"temperature": 0, "extra_body": {"ignore_eos": True}}
    assert [m.id for m in client.models.list().data] == [MODEL]
    done = client.completions.create(model=MODEL, prompt="the pool maps", max_tokens=8, **fixed)
    assert done.usage.completion_tokens == 8
    chat = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "hello"}], max_tokens=6, **fixed
    )
    assert chat.choices[0].message.role == "assistant"
    assert chat.usage.completion_tokens == 6
    chunks = list(
        client.completions.create(
            model=MODEL, prompt="memory", max_tokens=5, stream=True, stream_options={"include_usage": True}, **fixed
        )
    )
    assert [c.usage.completion_tokens for c in chunks if c.usage] == [5]
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"


def test_the_snapshot_is_complete_and_consistent(server: Server) -> None:
    snap = conforms("snapshot", server.admin().get("/kvpool").json())
    assert snap["physical_bytes"] == snap["mapped_bytes"] + snap["reserve_bytes"]
    for key in ("schema_version", "model", "layout", "page_bytes", "block_bytes", "virtual_bytes", "limit_bytes",
                "mapped_bytes", "reserve_bytes", "used_blocks", "cached_blocks", "free_blocks", "pending",
                "offload", "demand"):  # fmt: skip
        assert key in snap, key
    assert snap["layout"] == "LBHNC"
    assert snap["mapped_bytes"] % snap["page_bytes"] == 0
    assert snap["mapped_bytes"] <= snap["limit_bytes"] <= snap["virtual_bytes"]
    blocks = snap["used_blocks"] + snap["cached_blocks"] + snap["free_blocks"] + 1  # + the null block
    assert blocks == snap["mapped_bytes"] // snap["page_bytes"] * snap["blocks_per_page"]
    assert set(snap["demand"]) == {"running_requests", "waiting_requests", "preemptions", "finished_requests"}


def test_the_demand_counts_the_requests_the_engine_finished(server: Server) -> None:
    """The operator's demand policy reads a load that left from this counter (vLLM's own
    ``vllm:request_success``, every finish reason)."""
    before = server.admin().get("/kvpool").json()["demand"]["finished_requests"]
    openai_client(server).completions.create(model=MODEL, prompt="count me", max_tokens=2)
    assert server.admin().get("/kvpool").json()["demand"]["finished_requests"] == before + 1


def test_limit_revisions_round_trip(server: Server) -> None:
    admin = server.admin()
    rev = next(_revision)
    first = conforms("resize", admin.put("/kvpool/limit", json={"limit_bytes": 128 * MiB, "revision": rev}).json())
    assert first["status"] == "applied"
    assert first["effective_limit_bytes"] == 128 * MiB
    again = admin.put("/kvpool/limit", json={"limit_bytes": 128 * MiB, "revision": rev}).json()
    assert again["status"] == "applied"
    conflict = conforms("resize", admin.put("/kvpool/limit", json={"limit_bytes": 64 * MiB, "revision": rev}).json())
    assert conflict["status"] == "conflict"
    assert admin.put("/kvpool/limit", json={"limit_bytes": 64 * MiB, "revision": rev - 1}).json()["status"] == "stale"
    assert admin.get("/kvpool").json()["limit_bytes"] == 128 * MiB
    admin.put("/kvpool/limit", json={"limit_bytes": 256 * MiB, "revision": next(_revision)})


@pytest.mark.parametrize(("token", "status"), [(None, 401), ("wrong", 403)])
def test_admin_routes_refuse_a_missing_or_wrong_token(server: Server, token: str | None, status: int) -> None:
    admin = server.admin(token)
    for method, path in (("GET", "/kvpool"), ("PUT", "/kvpool/limit"), ("POST", "/kvpool/trim")):
        r = admin.request(method, path, json={"limit_bytes": MiB, "revision": 10**9})
        assert r.status_code == status, (method, path)
    assert server.admin().get("/kvpool").json()["pending"]["revision"] < 10**9


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b"{not json", "JSON"),
        ({"limit_bytes": "big", "revision": 1}, "limit_bytes"),
        ({"limit_bytes": 1.5, "revision": 1}, "limit_bytes"),
        ({"limit_bytes": -1, "revision": 1}, "greater than or equal to 0"),
        ({"limit_bytes": 1 << 60, "revision": 10**8}, "must be between"),
        ({"limit_bytes": MiB}, "revision"),
        ({"limit_bytes": MiB, "revision": 1, "force": True}, "force"),
    ],
)
def test_bad_limit_requests_are_4xx_with_a_message_and_change_nothing(server: Server, body: Any, message: str) -> None:
    admin = server.admin()
    before = admin.get("/kvpool").json()
    if isinstance(body, bytes):
        r = admin.put("/kvpool/limit", content=body, headers={"content-type": "application/json"})
    else:
        r = admin.put("/kvpool/limit", json=body)
    assert 400 <= r.status_code < 500
    assert message in r.text
    after = admin.get("/kvpool").json()
    assert (after["limit_bytes"], after["pending"]) == (before["limit_bytes"], before["pending"])


def test_metrics_carry_vllm_and_every_kvpool_series_and_move_with_load_and_resizes(server: Server) -> None:
    admin = server.admin()
    admin.post("/kvpool/trim")
    before = metrics(server)
    assert "vllm:num_requests_running" in before
    for name in DESIGN_METRICS:
        assert name in before, name
    openai_client(server).completions.create(model=MODEL, prompt=[list(range(10, 1500))], max_tokens=4)
    loaded = metrics(server)
    assert sample(loaded, "kvpool_mapped_bytes", model=MODEL) > sample(before, "kvpool_mapped_bytes", model=MODEL)
    applied = sample(loaded, "kvpool_resize", "kvpool_resize_total", model=MODEL, status="applied")
    admin.put("/kvpool/limit", json={"limit_bytes": 200 * MiB, "revision": next(_revision)})
    after = metrics(server)
    assert sample(after, "kvpool_resize", "kvpool_resize_total", model=MODEL, status="applied") == applied + 1
    assert sample(after, "kvpool_limit_bytes", model=MODEL) == 200 * MiB
    shrinks = sample(after, "kvpool_resize_seconds", "kvpool_resize_seconds_count", model=MODEL, direction="shrink")
    assert shrinks >= 1
    admin.put("/kvpool/limit", json={"limit_bytes": 256 * MiB, "revision": next(_revision)})


def test_trim_releases_memory(server: Server) -> None:
    admin = server.admin()
    openai_client(server).completions.create(model=MODEL, prompt=[list(range(10, 1800))], max_tokens=2)
    loaded = admin.get("/kvpool").json()
    released = admin.post("/kvpool/trim")
    assert released.status_code == 200
    assert conforms("trim", released.json())["released_pages"] >= 1
    trimmed = admin.get("/kvpool").json()
    assert trimmed["mapped_bytes"] < loaded["mapped_bytes"]
    assert trimmed["mapped_bytes"] <= trimmed["page_bytes"] * 2


def test_a_prefix_released_by_trim_comes_back_from_the_cpu_tier_and_is_counted(server: Server) -> None:
    admin, client = server.admin(), openai_client(server)
    prompt = [list(range(300, 300 + 32 * 40))]  # 40 whole blocks
    first = client.completions.create(model=MODEL, prompt=prompt, max_tokens=4, temperature=0,
                                      extra_body={"ignore_eos": True})  # fmt: skip
    before = metrics(server)
    admin.post("/kvpool/trim")  # the pool drops the cached prefix: the tier keeps it
    again = client.completions.create(model=MODEL, prompt=prompt, max_tokens=4, temperature=0,
                                      extra_body={"ignore_eos": True})  # fmt: skip
    after = metrics(server)
    assert again.choices[0].text == first.choices[0].text
    hits = sample(after, "kvpool_offload_hits", "kvpool_offload_hits_total", model=MODEL) - sample(
        before, "kvpool_offload_hits", "kvpool_offload_hits_total", model=MODEL
    )
    assert hits >= 36  # the blocks beside the null block in page 0 may stay in the pool
    assert sample(after, "kvpool_offload_capacity_bytes", model=MODEL) == 64 * MiB
    assert any(name.startswith("vllm:kv_offload") for name in after)  # vLLM's own offload series too


def test_64_streams_survive_a_limit_cut_and_restore_without_leaks(server: Server) -> None:
    import openai

    async def stream(client: Any, i: int) -> int:
        # count with the usage report: a lagging client gets several tokens per chunk
        tokens = 0
        resp = await client.completions.create(
            model=MODEL, prompt=[list(range(10 + i, 300 + i))], max_tokens=48, stream=True, temperature=0,
            stream_options={"include_usage": True}, extra_body={"ignore_eos": True},
        )  # fmt: skip
        async for chunk in resp:
            if chunk.usage is not None:
                tokens = chunk.usage.completion_tokens
        return tokens

    async def scenario() -> list[int]:
        client = openai.AsyncOpenAI(base_url=server.url + "/v1", api_key=API_KEY, max_retries=0, timeout=300)
        tasks = [asyncio.create_task(stream(client, i)) for i in range(64)]
        async with httpx.AsyncClient(base_url=server.admin_url, headers={"Authorization": f"Bearer {TOKEN}"},
                                     timeout=60) as admin:  # fmt: skip
            await asyncio.sleep(1.0)
            cut = await admin.put("/kvpool/limit", json={"limit_bytes": 8 * MiB, "revision": next(_revision)})
            assert cut.json()["status"] in ("applied", "deferred")
            await asyncio.sleep(1.0)
            await admin.put("/kvpool/limit", json={"limit_bytes": 256 * MiB, "revision": next(_revision)})
        return list(await asyncio.gather(*tasks))

    counts = asyncio.run(scenario())
    assert counts == [48] * 64
    admin = server.admin()
    assert admin.get("/kvpool/integrity").json() == {"ok": True}
    assert admin.get("/kvpool").json()["used_blocks"] == 0


def test_openai_routes_keep_vllms_api_key_and_admin_routes_their_own_token(server: Server) -> None:
    assert httpx.get(server.url + "/v1/models").status_code == 401
    assert httpx.get(server.url + "/v1/models", headers={"Authorization": f"Bearer {API_KEY}"}).status_code == 200
    assert server.admin(API_KEY).get("/kvpool").status_code == 403  # the API key is not the admin token
    assert httpx.get(server.url + "/metrics").status_code == 200  # scrapes need no credentials
    assert httpx.get(server.url + "/livez").json() == {"alive": True}


def test_the_openai_port_serves_the_snapshot_alone_and_the_admin_port_no_openai_route(server: Server) -> None:
    auth = {"Authorization": f"Bearer {TOKEN}"}
    assert httpx.get(server.url + "/kvpool", headers=auth).json()["model"] == MODEL  # read-only, for the router
    body = {"limit_bytes": MiB, "revision": 10**9}
    for method, path in (("PUT", "/kvpool/limit"), ("POST", "/kvpool/trim"), ("GET", "/kvpool/integrity")):
        assert httpx.request(method, server.url + path, json=body, headers=auth).status_code == 404, path
    assert server.admin().get("/kvpool").json()["pending"]["revision"] < 10**9
    completion = {"model": MODEL, "prompt": "x", "max_tokens": 1}
    assert httpx.post(server.admin_url + "/v1/completions", json=completion, headers=auth).status_code == 404
    assert server.admin().get("/openapi.json").json()["info"]["title"] == "kvpool admin"


def test_a_rotated_admin_token_takes_effect_without_a_restart(server: Server) -> None:
    token = server.log.parent / "admin-token"  # the file start_server gave --admin-token-file
    staged = token.with_name("admin-token.new")
    try:
        staged.write_text("rotated-token")
        os.replace(staged, token)  # as the kubelet swaps a mounted Secret
        assert server.admin().get("/kvpool").status_code == 403  # the old token no longer opens the door
        assert server.admin("rotated-token").get("/kvpool").status_code == 200
    finally:
        staged.write_text(TOKEN)
        os.replace(staged, token)
    assert server.admin().get("/kvpool").status_code == 200


def test_secrets_never_reach_the_log_the_snapshot_or_the_metrics(server: Server) -> None:
    admin = server.admin()
    admin.put("/kvpool/limit", json={"limit_bytes": 256 * MiB, "revision": next(_revision)})
    assert server.admin("wrong").get("/kvpool").status_code == 403
    seen = {
        "log": server.log.read_text(),
        "snapshot": admin.get("/kvpool").text,
        "metrics": httpx.get(server.url + "/metrics").text,
        "openapi": admin.get("/openapi.json").text,
    }
    for where, text in seen.items():
        for secret in (TOKEN, API_KEY):
            assert secret not in text, f"{where} holds a secret"


def _used_blocks_reach_zero(server: Server, timeout_s: float = 60) -> float:
    """Seconds until no block is in use (the request's blocks are back)."""
    t0 = time.monotonic()
    while server.admin().get("/kvpool").json()["used_blocks"]:
        assert time.monotonic() - t0 < timeout_s, "blocks still in use"
        time.sleep(0.1)
    return time.monotonic() - t0


def test_a_client_gone_mid_stream_frees_its_blocks(server: Server) -> None:
    body = {"model": MODEL, "prompt": [list(range(10, 600))], "max_tokens": 1500, "stream": True, "ignore_eos": True}
    headers = {"Authorization": f"Bearer {API_KEY}"}
    with httpx.stream("POST", server.url + "/v1/completions", json=body, headers=headers, timeout=60) as r:
        lines = r.iter_lines()
        for _ in range(3):
            next(lines)
        assert server.admin().get("/kvpool").json()["used_blocks"] > 0  # mid-stream: it holds blocks
    # the connection is closed here, 1,497 tokens early
    print(f"blocks back {_used_blocks_reach_zero(server):.2f} s after the client left")
    assert server.admin().get("/kvpool/integrity").json() == {"ok": True}


def test_a_client_that_never_reads_its_stream_does_not_hold_blocks(server: Server) -> None:
    """The engine finishes the request and frees its blocks; the unread reply waits in buffers."""
    port = int(server.url.rsplit(":", 1)[1])
    body = json.dumps({"model": MODEL, "prompt": "never read", "max_tokens": 512, "stream": True,
                       "ignore_eos": True}).encode()  # fmt: skip
    head = (f"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {API_KEY}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n").encode()  # fmt: skip
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.sendall(head + body)
        t0 = time.monotonic()
        while not server.admin().get("/kvpool").json()["used_blocks"]:
            assert time.monotonic() - t0 < 30, "the request never started"
            time.sleep(0.05)
        print(f"blocks back {_used_blocks_reach_zero(server):.2f} s later, the reply still unread")
    assert server.admin().get("/kvpool/integrity").json() == {"ok": True}
    assert httpx.get(server.url + "/readyz").status_code == 200


def test_requests_carry_ids_and_logs_are_json_lines(server: Server) -> None:
    r = httpx.post(
        server.url + "/v1/completions", json={"model": MODEL, "prompt": "ids", "max_tokens": 2},
        headers={"Authorization": f"Bearer {API_KEY}", "X-Request-Id": "req-42"}, timeout=60,
    )  # fmt: skip
    assert r.headers["x-request-id"] == "req-42"
    rev = next(_revision)
    server.admin().put(
        "/kvpool/limit", json={"limit_bytes": 256 * MiB, "revision": rev}, headers={"X-Request-Id": "r7"}
    )
    records = [json.loads(line) for line in server.log.read_text().splitlines() if line.startswith("{")]
    resize = [r for r in records if r.get("message") == "resize" and r.get("revision") == rev]
    assert resize, "no JSON log record for the resize"
    assert resize[0]["request_id"] == "r7"
    assert {"asctime", "levelname", "name"} <= set(resize[0])
