"""The router over two real servers, driven with the official openai client and raw HTTP."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import httpx
import openai
import psutil
import pytest

from tests.server.conftest import API_KEY, TOKEN, Server, start_server, stop_server
from tests.server.router.conftest import Router, start_router, stop_router

pytestmark = [pytest.mark.e2e, pytest.mark.slow]
FIXED: dict[str, Any] = {"temperature": 0, "extra_body": {"ignore_eos": True}}  # the random model stops early


def client(router: Router, **kw: Any) -> openai.OpenAI:
    return openai.OpenAI(base_url=router.url + "/v1", api_key=API_KEY, max_retries=0, timeout=120, **kw)


def used_blocks(server: Server) -> int:
    return int(server.admin().get("/kvpool").json()["used_blocks"])


def test_models_lists_both_and_each_answers_completions_chats_and_streams(router: Router) -> None:
    c = client(router)
    assert sorted(m.id for m in c.models.list()) == ["alpha", "beta"]
    for model in ("alpha", "beta"):
        done = c.completions.create(model=model, prompt="the pool", max_tokens=5, **FIXED)
        assert (done.model, done.usage.completion_tokens if done.usage else 0) == (model, 5)
        chat = c.chat.completions.create(model=model, messages=[{"role": "user", "content": "hi"}], max_tokens=4,
                                         **FIXED)  # fmt: skip
        assert chat.model == model
        assert chat.choices[0].finish_reason == "length"
        chunks = list(c.completions.create(model=model, prompt="a", max_tokens=6, stream=True,
                                           stream_options={"include_usage": True}, **FIXED))  # fmt: skip
        assert chunks[-1].usage is not None
        assert chunks[-1].usage.completion_tokens == 6


def test_an_unknown_model_is_404_naming_the_models_that_exist(router: Router) -> None:
    with pytest.raises(openai.NotFoundError, match=r"'gpt-4' does not exist; this group serves: alpha, beta"):
        client(router).completions.create(model="gpt-4", prompt="x", max_tokens=1)


@pytest.mark.parametrize(
    ("body", "message"),
    [(b"{not json", "is not JSON"), (b'{"prompt": "x"}', "'model' is missing"), (b"[1, 2]", "JSON object")],
)
def test_a_body_without_a_usable_model_is_400_in_openais_format(router: Router, body: bytes, message: str) -> None:
    r = httpx.post(router.url + "/v1/completions", content=body, headers={"Authorization": f"Bearer {API_KEY}"})
    assert r.status_code == 400
    error = r.json()["error"]
    assert message in error["message"]
    assert (error["type"], error["code"]) == ("BadRequestError", 400)


def test_a_servers_own_400_and_request_id_pass_through(router: Router) -> None:
    r = httpx.post(router.url + "/v1/completions", json={"model": "alpha", "prompt": "x", "max_tokens": -1},
                   headers={"Authorization": f"Bearer {API_KEY}", "X-Request-Id": "req-router-1"})  # fmt: skip
    assert r.status_code == 400
    assert "max_tokens" in r.json()["error"]["message"]  # vLLM's message, untouched
    ok = httpx.post(router.url + "/v1/completions", json={"model": "beta", "prompt": "x", "max_tokens": 1},
                    headers={"Authorization": f"Bearer {API_KEY}", "X-Request-Id": "req-router-2"})  # fmt: skip
    assert ok.status_code == 200
    assert ok.headers["x-request-id"] == "req-router-2"


def test_the_api_key_guards_the_openai_routes(router: Router) -> None:
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=router.url + "/v1", api_key="wrong", max_retries=0).models.list()
    assert httpx.post(router.url + "/v1/completions", json={"model": "alpha"}).status_code == 401
    assert httpx.get(router.url + "/metrics").status_code == 200  # scrapes need no credentials


def test_kvpool_is_every_models_snapshot_behind_the_admin_token(router: Router) -> None:
    assert httpx.get(router.url + "/kvpool").status_code == 401
    assert httpx.get(router.url + "/kvpool", headers={"Authorization": "Bearer nope"}).status_code == 403
    snaps = httpx.get(router.url + "/kvpool", headers={"Authorization": f"Bearer {TOKEN}"}).json()["models"]
    assert {name: s["model"] for name, s in snaps.items()} == {"alpha": "alpha", "beta": "beta"}


def test_64_streams_over_both_models_all_complete_with_every_token(router: Router, pair: dict[str, Server]) -> None:
    async def stream(c: openai.AsyncOpenAI, i: int) -> int:
        resp = await c.completions.create(model=("alpha", "beta")[i % 2], prompt=[list(range(10 + i, 200 + i))],
                                          max_tokens=24, stream=True, stream_options={"include_usage": True},
                                          **FIXED)  # fmt: skip
        return [chunk.usage.completion_tokens async for chunk in resp if chunk.usage is not None][-1]

    async def scenario() -> list[int]:
        c = openai.AsyncOpenAI(base_url=router.url + "/v1", api_key=API_KEY, max_retries=0, timeout=300)
        return list(await asyncio.gather(*(stream(c, i) for i in range(64))))

    assert asyncio.run(scenario()) == [24] * 64
    metrics = httpx.get(router.url + "/metrics").text
    assert 'kvpool_router_requests_total{code="200",model="alpha"}' in metrics
    assert all(used_blocks(s) == 0 for s in pair.values())


def test_a_client_that_leaves_mid_stream_aborts_the_request_and_frees_its_blocks(
    router: Router, pair: dict[str, Server]
) -> None:
    stream = client(router).completions.create(model="alpha", prompt=[list(range(10, 400))], max_tokens=1500,
                                               stream=True, **FIXED)  # fmt: skip
    for i, _ in enumerate(stream):
        if i == 3:
            break
    assert used_blocks(pair["alpha"]) > 0  # still generating when the client leaves
    stream.close()
    deadline = time.monotonic() + 30
    while used_blocks(pair["alpha"]) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert used_blocks(pair["alpha"]) == 0
    assert 'code="499",model="alpha"' in httpx.get(router.url + "/metrics").text


def test_a_killed_server_fails_its_requests_cleanly_while_the_other_model_serves(
    pair: dict[str, Server], tiny_model: Path, tmp_path: Path
) -> None:
    doomed = start_server(tiny_model, tmp_path, "--api-key", API_KEY, "--served-model-name", "gamma")
    engine = psutil.Process(doomed.proc.pid).children(recursive=True)  # orphaned by the kill: reaped below
    router = start_router(tmp_path, {"alpha": pair["alpha"].url, "gamma": doomed.url})
    try:
        c = openai.OpenAI(base_url=router.url + "/v1", api_key=API_KEY, max_retries=0, timeout=60)
        stream = c.completions.create(model="gamma", prompt="x", max_tokens=1500, stream=True, **FIXED)
        next(iter(stream))
        doomed.proc.kill()
        with pytest.raises(openai.APIError, match="broke off the stream"):
            list(stream)
        with pytest.raises(openai.InternalServerError) as exc:  # 503, Retry-After
            c.completions.create(model="gamma", prompt="x", max_tokens=1)
        assert exc.value.response.status_code == 503
        assert exc.value.response.headers["retry-after"] == "5"
        assert c.completions.create(model="alpha", prompt="x", max_tokens=2, **FIXED).usage.completion_tokens == 2
        ready = httpx.get(router.url + "/readyz")
        assert (ready.status_code, ready.json()["models"]) == (503, {"alpha": True, "gamma": False})
    finally:
        stop_router(router)
        if doomed.proc.poll() is None:
            stop_server(doomed)
        for child in engine:
            child.kill()
