"""The router's pure parts: which model a body names, and what its settings accept."""

from __future__ import annotations

import pytest
from kvpool_server.router.errors import RouterError
from kvpool_server.router.proxy import model_of
from kvpool_server.router.settings import RouterSettings

NAMES = ["llama", "qwen"]


def test_the_model_is_read_from_the_json_body() -> None:
    assert model_of(b'{"model": "qwen", "prompt": "x"}', NAMES) == "qwen"


@pytest.mark.parametrize(
    ("body", "status", "message"),
    [
        (b"", 400, "'model' field"),
        (b"\xff", 400, "not JSON"),
        (b'"llama"', 400, "JSON object"),
        (b'{"model": 3}', 400, "this group serves: llama, qwen"),
        (b'{"model": "gpt"}', 404, "'gpt' does not exist; this group serves: llama, qwen"),
    ],
)
def test_bodies_without_a_served_model_say_what_to_fix(body: bytes, status: int, message: str) -> None:
    with pytest.raises(RouterError) as exc:
        model_of(body, NAMES)
    assert exc.value.status == status
    assert message in exc.value.message
    assert exc.value.response().status_code == status


def test_upstreams_keep_their_order_and_lose_a_trailing_slash() -> None:
    s = RouterSettings(upstream=["b=http://h:2/", "a=http://h:1"])
    assert s.upstreams() == {"b": "http://h:2", "a": "http://h:1"}


@pytest.mark.parametrize(
    ("upstream", "message"),
    [
        ([], "at least one"),
        (["x"], "NAME=http"),
        (["x=ftp://h"], "NAME=http"),
        (["a=http://h", "a=http://g"], "repeat"),
    ],
)
def test_bad_upstreams_are_refused_naming_the_form(upstream: list[str], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        RouterSettings(upstream=upstream)


def test_a_503_carries_retry_after() -> None:
    r = RouterError(503, "not ready", "model", retry_after_s=7).response()
    assert (r.status_code, r.headers["retry-after"]) == (503, "7")
