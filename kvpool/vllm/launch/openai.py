"""vLLM's own OpenAI server pieces, re-exported for ``kvpool_server`` (which must not import
vLLM itself: only ``kvpool.vllm`` does). Thin on purpose: argument parsing, the engine client,
the app, the metrics registry and the HTTP loop are all vLLM's.
"""

from __future__ import annotations

import argparse
import contextlib
import socket
from collections.abc import AsyncIterator
from typing import Any


def parse_serve_args(argv: list[str]) -> argparse.Namespace:
    """Parse ``vllm serve`` flags exactly as vLLM does (and validate them)."""
    from vllm.entrypoints.launchers.cli_args import make_arg_parser, validate_parsed_serve_args
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = make_arg_parser(FlexibleArgumentParser(prog="kvpool-server (vLLM flags)"))
    args = parser.parse_args(argv)
    validate_parsed_serve_args(args)
    return args


def listen_socket(args: argparse.Namespace) -> tuple[str, socket.socket]:
    """Bind the HTTP port before the engine starts (vLLM's own order)."""
    from vllm.entrypoints.launchers.launcher import setup_server

    address, sock = setup_server(args, reuse_port=False)
    return str(address), sock


@contextlib.asynccontextmanager
async def engine_client(args: argparse.Namespace) -> AsyncIterator[Any]:
    """An AsyncLLM for ``args`` (engine core in its own process), shut down on exit."""
    from vllm.entrypoints.launchers.api_server.entry import build_async_engine_client

    async with build_async_engine_client(args) as client:
        yield client


async def openai_app(client: Any, args: argparse.Namespace) -> Any:
    """vLLM's FastAPI app (completions, chat, models, tokenize, health, /metrics), initialised."""
    from vllm.entrypoints.launchers.api_server.app_state import init_app_state
    from vllm.entrypoints.launchers.app import build_app

    tasks = await client.get_supported_tasks()
    app = build_app(args, tasks, client.model_config)
    await init_app_state(client, app.state, args, tasks)
    return app


async def serve(app: Any, sock: socket.socket, args: argparse.Namespace, **uvicorn_kwargs: Any) -> Any:
    """vLLM's uvicorn loop (signal handling, engine watchdog); returns the shutdown task."""
    from vllm.entrypoints.launchers.launcher import serve_http

    return await serve_http(
        app, sock=sock, host=args.host, port=args.port, log_level=args.uvicorn_log_level,
        access_log=not args.disable_uvicorn_access_log, **uvicorn_kwargs,
    )  # fmt: skip


def prometheus_registry() -> Any:
    """The registry vLLM's ``/metrics`` serves (``vllm:*`` series); ours join it."""
    from vllm.v1.metrics.prometheus import get_prometheus_registry

    return get_prometheus_registry()
