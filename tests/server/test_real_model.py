"""The default model of ``make serve`` -- SmolLM2-135M-Instruct, converted from the PyPI wheel by
``make model`` -- served through kvpool-server and asked factual questions with the openai client.

Nothing is downloaded here: the model comes from the install step's cache. ``make test`` sets
KVPOOL_REQUIRE_SMOLLM2=1, so a missing model fails there instead of skipping."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from kvpool.vllm.launch.args import model_shape
from kvpool.vllm.launch.smollm2 import NAME, model_dir
from tests.server.conftest import API_KEY, Server, start_server, stop_server

pytestmark = [pytest.mark.e2e, pytest.mark.slow]
DEFAULT_ROOT = Path.home() / ".cache" / "kvpool" / "models"


@pytest.fixture(scope="module")
def smollm2() -> Path:
    path = Path(os.environ.get("KVPOOL_SMOLLM2_DIR") or model_dir(DEFAULT_ROOT))
    if not (path / "config.json").is_file():
        message = f"{NAME} is not converted at {path}: run `make model` (it fetches the wheel once)"
        if os.environ.get("KVPOOL_REQUIRE_SMOLLM2") == "1":
            pytest.fail(message)
        pytest.skip(message)
    return path


@pytest.fixture(scope="module")
def real_server(smollm2: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    s = start_server(smollm2, tmp_path_factory.mktemp("smollm2"), "--api-key", API_KEY, limit="64Mi", virtual="256Mi")
    yield s
    stop_server(s)


def chat(server: Server, question: str, **kw: Any) -> Any:
    import openai

    client = openai.OpenAI(base_url=server.url + "/v1", api_key=API_KEY, max_retries=0, timeout=120)
    messages: Any = [{"role": "user", "content": question}]
    return client.chat.completions.create(model=NAME, messages=messages, temperature=0, max_tokens=32, **kw)


def test_the_converted_folder_is_a_plain_llama_with_its_chat_template(smollm2: Path) -> None:
    shape = model_shape(str(smollm2), block_size=32)
    assert (shape.num_layers, shape.num_kv_heads, shape.head_dim, shape.dtype_bytes) == (30, 3, 64, 2)
    assert shape.block_bytes == 32 * 23_040  # 23,040 bytes of KV per token
    assert "<|im_start|>" in (smollm2 / "chat_template.jinja").read_text()
    assert list(smollm2.glob("*.safetensors"))


def test_a_greedy_chat_answers_a_factual_question(real_server: Server) -> None:
    reply = chat(real_server, "What is the capital of France?")
    assert "Paris" in reply.choices[0].message.content
    assert reply.choices[0].finish_reason == "stop"
    assert reply.model == NAME


def test_a_streamed_chat_gives_the_same_answer_and_frees_its_blocks(real_server: Server) -> None:
    stream = chat(real_server, "Name three colors.", stream=True, stream_options={"include_usage": True})
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert sum(color in text for color in ("Red", "Blue", "Green", "Yellow")) >= 3, text
    usage = chunks[-1].usage
    assert usage is not None
    assert usage.completion_tokens > 3
    snapshot = real_server.admin().get("/kvpool").json()
    assert (snapshot["model"], snapshot["block_bytes"]) == (NAME, 32 * 23_040)
    assert snapshot["used_blocks"] == 0
    assert real_server.admin().get("/kvpool/integrity").status_code == 200


def test_the_connector_costs_the_engine_no_extra_reserved_core(real_server: Server) -> None:
    # vLLM's CPU backend reserves a core more for any KV connector; on 2 cores that bound the model
    # to every core, beside the scheduler and the API server. We reserve what stock reserves.
    # (This server logs plain lines: with --log-json the engine core's records are not shown.)
    log = real_server.log.read_text()
    assert "reserve_cpu_num=1" in log
    assert "should be greater than reserved CPU core number" not in log
