"""SIGTERM under load: in-flight streams are drained to their end within the grace period, then
the process exits on its own (and its memory goes with it)."""

from __future__ import annotations

import asyncio
import signal
import time
from pathlib import Path
from typing import Any

import pytest

from tests.server.conftest import start_server

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


def test_sigterm_drains_in_flight_streams_and_exits_within_the_grace_period(tiny_model: Path, tmp_path: Path) -> None:
    import openai

    server = start_server(tiny_model, tmp_path, "--grace-period-s", "30")
    started: list[int] = []

    async def stream(client: Any, i: int) -> tuple[int, str | None]:
        # count with the usage report: a lagging client gets several tokens per chunk
        tokens, reason, first = 0, None, True
        resp = await client.completions.create(
            model="tiny", prompt=[list(range(10 + i, 200 + i))], max_tokens=96, stream=True, temperature=0,
            stream_options={"include_usage": True}, extra_body={"ignore_eos": True},
        )  # fmt: skip
        async for chunk in resp:
            if first:  # in flight: its first token is out
                first = False
                started.append(i)
            if chunk.usage is not None:
                tokens = chunk.usage.completion_tokens
            if chunk.choices:
                reason = chunk.choices[0].finish_reason or reason
        return tokens, reason

    async def scenario() -> list[tuple[int, str | None]]:
        client = openai.AsyncOpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=120)
        tasks = [asyncio.create_task(stream(client, i)) for i in range(16)]
        # SIGTERM once every stream is in flight (a fixed sleep raced a busy machine: a request
        # still in the API process's preprocessing when the signal came got an empty stream)
        deadline = time.monotonic() + 60
        while len(started) < 16 and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        server.proc.send_signal(signal.SIGTERM)
        return list(await asyncio.gather(*tasks))

    try:
        start = time.monotonic()
        results = asyncio.run(scenario())
        code = server.proc.wait(timeout=60)
        elapsed = time.monotonic() - start
    finally:
        if server.proc.poll() is None:
            server.proc.kill()
    assert results == [(96, "length")] * 16  # drained, not cut off
    assert code == 0, server.log.read_text()[-2000:]
    assert elapsed < 30 + 15
