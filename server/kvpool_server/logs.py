"""Logging: plain lines by default, one JSON object per line with ``--log-json`` (vLLM's loggers
included, so a log pipeline parses every line the same way)."""

from __future__ import annotations

import logging
import os


def configure_logging(json_lines: bool) -> None:
    handler = logging.StreamHandler()
    if json_lines:
        from pythonjsonlogger.json import JsonFormatter

        handler.setFormatter(JsonFormatter("%(asctime)s %(levelname)s %(name)s %(message)s"))
        os.environ["VLLM_CONFIGURE_LOGGING"] = "0"  # vLLM's records propagate to our handler
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(logging.INFO)
    # Our own records never depend on the root: vLLM and uvicorn reconfigure logging while the
    # engine and the HTTP server start (seen: records of later loggers vanished).
    for name in ("kvpool", "kvpool_server"):
        ours = logging.getLogger(name)
        ours.handlers[:] = [handler]
        ours.setLevel(logging.INFO)
        ours.propagate = False
        ours.disabled = False
