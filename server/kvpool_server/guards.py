"""Request guards in front of vLLM's OpenAI routes, for inputs that vLLM 0.32 answers with a 500.

Loaded through vLLM's own ``--middleware`` flag (``cli.vllm_argv``): a pure ASGI middleware, so
streamed replies pass through untouched. Only the completion routes' bodies are looked at, and only
parsed when they name a guarded field, so an ordinary request costs one substring search.

* ``length_penalty`` with ``use_beam_search``: vLLM scores a beam as
  ``logprob / len ** length_penalty``; beyond about +-50 the power overflows or reaches 0.0 and the
  request fails inside vLLM ("float division by zero", found by the fuzz test). Refused with a 400
  that names the field.
"""

from __future__ import annotations

import json
import math
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from starlette.responses import JSONResponse

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

ROUTES = frozenset({"/v1/completions", "/v1/chat/completions"})
MAX_LENGTH_PENALTY = 50.0  # 2**20 tokens ** 50 is still a finite, non-zero float


def check_body(body: bytes) -> tuple[str, str] | None:
    """(field, what to fix) for a body vLLM would fail on; None if it is fine (or not JSON at
    all: vLLM's own validation answers that with a 400)."""
    if b"length_penalty" not in body:
        return None
    try:
        request = json.loads(body)
    except ValueError:
        return None
    if not isinstance(request, dict) or request.get("use_beam_search") is not True:
        return None
    penalty = request.get("length_penalty", 1.0)
    if isinstance(penalty, int | float) and not (math.isfinite(penalty) and abs(penalty) <= MAX_LENGTH_PENALTY):
        return "length_penalty", (
            f"length_penalty must be between -{MAX_LENGTH_PENALTY:g} and {MAX_LENGTH_PENALTY:g} with "
            f"use_beam_search (got {penalty!r}): beams are scored as logprob / length ** length_penalty"
        )
    return None


class RequestGuard:
    """ASGI middleware: reads a completion route's body, refuses it with an OpenAI-style 400 when
    :func:`check_body` objects, else replays it to vLLM unchanged."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "POST" or scope["path"] not in ROUTES:
            await self.app(scope, receive, send)
            return
        messages, body = await _read_body(receive)
        problem = check_body(body)
        if problem is not None:
            field, message = problem
            error = {"message": message, "type": "BadRequestError", "param": field, "code": 400}
            await JSONResponse({"error": error}, status_code=400)(scope, receive, send)
            return
        await self.app(scope, _replay(messages, receive), send)


async def _read_body(receive: Receive) -> tuple[list[Message], bytes]:
    messages, chunks = [], []
    while True:
        message = await receive()
        messages.append(message)
        if message["type"] != "http.request":
            break  # the client left: vLLM sees the disconnect in the replay
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            break
    return messages, b"".join(chunks)


def _replay(messages: list[Message], receive: Receive) -> Receive:
    pending = list(messages)

    async def replay() -> Message:
        return pending.pop(0) if pending else await receive()  # then the live channel (disconnects)

    return replay
