"""``python -m kvpool_server.router``: parse settings, serve until SIGTERM (in-flight requests finish)."""

from __future__ import annotations

import logging
import sys

import uvicorn

from kvpool_server.flags import parse_flags
from kvpool_server.logs import configure_logging
from kvpool_server.router.app import build_app
from kvpool_server.router.settings import RouterSettings

log = logging.getLogger("kvpool_server.router")


def main(argv: list[str] | None = None) -> None:
    settings = parse_flags(RouterSettings, sys.argv[1:] if argv is None else argv)
    configure_logging(settings.log_json)
    log.info("routing %s on %s:%d", ", ".join(settings.upstreams()), settings.host, settings.port)
    # no access log: one line per token stream costs more than the routing itself
    uvicorn.run(build_app(settings), host=settings.host, port=settings.port, access_log=False, log_config=None,
                timeout_graceful_shutdown=30)  # fmt: skip
