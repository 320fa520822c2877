"""``kvpool-server`` / ``python -m kvpool_server``: parse settings, build vLLM's arguments with
the pool's connector, and serve until SIGTERM (in-flight requests get ``--grace-period-s``)."""

from __future__ import annotations

import argparse
import logging
import os
import shlex
import socket
import sys
from pathlib import Path

from kvpool import ConfigError
from kvpool.vllm.launch.args import PoolEngineConfig
from kvpool.vmm.base import BackendKind
from kvpool_server import door
from kvpool_server.flags import parse_flags
from kvpool_server.logs import configure_logging
from kvpool_server.settings import POOL_FIELDS, ServerSettings

log = logging.getLogger("kvpool_server")


def parse_settings(argv: list[str]) -> ServerSettings:
    """Flags and KVPOOL_* environment; a bad value exits with the option's name."""
    return parse_flags(ServerSettings, argv)


def pool_config(settings: ServerSettings, model: str) -> PoolEngineConfig:
    """The engine config: the pool's options by name (one field set), plus what needs a type change."""
    return PoolEngineConfig(
        model=model,
        backend=BackendKind(settings.backend),
        served_name=settings.served_model_name,
        offload_dir=str(settings.offload_dir),
        **{name: getattr(settings, name) for name in POOL_FIELDS},
    )


def vllm_argv(settings: ServerSettings, pool: PoolEngineConfig) -> list[str]:
    argv = [
        "--model", pool.model,
        "--served-model-name", pool.settings().model,
        "--host", settings.host,
        "--port", str(settings.port),
        "--max-model-len", str(settings.max_model_len),
        "--shutdown-timeout", str(int(settings.grace_period_s)),
        "--enable-request-id-headers",
        "--middleware", "kvpool_server.guards.RequestGuard",  # inputs vLLM would answer with a 500
        *pool.cli_args(),
    ]  # fmt: skip
    if settings.eager:
        argv.append("--enforce-eager")
    if settings.api_key is not None:
        argv += ["--api-key", settings.api_key.get_secret_value()]
    return argv + shlex.split(settings.vllm_args)


def resolve_model(settings: ServerSettings) -> str:
    if settings.model:
        return settings.model
    from kvpool.vllm.launch.tiny_model import build_tiny_model

    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # the embedded model never needs the hub
    return str(build_tiny_model(Path(settings.model_cache) / "tiny-model"))


async def serve(settings: ServerSettings, pool: PoolEngineConfig, args: argparse.Namespace,
                admin_sock: socket.socket) -> None:  # fmt: skip
    from kvpool.vllm.launch import openai as vllm_openai
    from kvpool_server.app import build_apps

    _, sock = vllm_openai.listen_socket(args)
    async with vllm_openai.engine_client(args) as client:
        apps = await build_apps(settings, pool, args, client)
        configure_logging(settings.log_json)  # again: starting the engine reconfigured logging
        async with door.serving(apps.admin, admin_sock):
            shutdown = await vllm_openai.serve(apps.public, sock, args,
                                               timeout_graceful_shutdown=settings.grace_period_s)  # fmt: skip
    try:
        await shutdown
    finally:
        sock.close()


def main(argv: list[str] | None = None) -> None:
    settings = parse_settings(sys.argv[1:] if argv is None else argv)
    configure_logging(settings.log_json)
    os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")
    os.environ.setdefault("DO_NOT_TRACK", "1")
    try:
        pool = pool_config(settings, resolve_model(settings))
        os.environ.update(pool.env())
        from kvpool.vllm.launch.openai import parse_serve_args

        args = parse_serve_args(vllm_argv(settings, pool))
        admin_sock = door.bind_admin_port(settings.host, settings.admin_port)
    except ConfigError as e:
        sys.exit(f"kvpool-server: error: {e}")
    log.info("serving %s on %s:%d, admin API on port %d (kvpool control %s)", pool.model, settings.host,
             settings.port, settings.admin_port, pool.control_address)  # fmt: skip
    import uvloop

    uvloop.run(serve(settings, pool, args, admin_sock))


if __name__ == "__main__":
    main()
