"""The group launcher: every model's kvpool-server and the group's router in one container (the
device-plugin mode, where only one container can hold the pod's GPU).

    KVPOOL_GROUP_SERVERS='[{"name": "llama", "args": ["--model", "...", "--port", "8001", ...]},
                           {"name": "router", "module": "kvpool_server.router", "args": [...]}]'
    python -m kvpool_server.group

or, on one machine, a group behind one port without writing that JSON (servers on PORT+1, ...,
their admin APIs on PORT+101, ...):

    python -m kvpool_server.group --serve smol=/models/SmolLM2 --serve tiny=tiny --port 8000

Starts one process per entry (``module``: ``kvpool_server``, the default, or
``kvpool_server.router``), forwards SIGTERM/SIGINT to all (each drains its requests), and exits as
soon as any of them exits -- with its status, or 1 if it ended on its own with 0 -- after stopping
the others, so Kubernetes restarts the pod rather than leaving a group with a model (or its
endpoint) missing.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from typing import Any

ENV = "KVPOOL_GROUP_SERVERS"
MODULES = ("kvpool_server", "kvpool_server.router")


def parse(raw: str | None) -> list[dict[str, Any]]:
    """The launcher's one input; errors say what to fix."""
    if not raw:
        sys.exit(f"kvpool-group: error: set {ENV} to a JSON list of {{'name', 'args'}} objects, or use --serve")
    try:
        servers = json.loads(raw)
    except json.JSONDecodeError as e:
        sys.exit(f"kvpool-group: error: {ENV} is not JSON: {e}")
    if not isinstance(servers, list) or not servers:
        sys.exit(f"kvpool-group: error: {ENV} must be a non-empty JSON list")
    for i, s in enumerate(servers):
        if not isinstance(s, dict) or not isinstance(s.get("name"), str) or not isinstance(s.get("args"), list):
            sys.exit(f"kvpool-group: error: {ENV}[{i}] needs a string 'name' and a list 'args'")
        if s.get("module", MODULES[0]) not in MODULES:
            sys.exit(f"kvpool-group: error: {ENV}[{i}].module must be one of {', '.join(MODULES)}")
    return servers


def local_group(argv: list[str]) -> list[dict[str, Any]]:
    """``--serve NAME=MODEL ...``: the entries for one machine, the router on ``--port``."""
    p = argparse.ArgumentParser(prog="kvpool-group", description="Serve several models behind one OpenAI port.")
    p.add_argument("--serve", action="append", required=True, metavar="NAME=MODEL",
                   help="serve MODEL (a folder, an id, or 'tiny') as NAME; repeat per model")  # fmt: skip
    p.add_argument("--port", type=int, default=8000, help="the router's port; servers take the next ones")
    p.add_argument("--server-args", default="", help="extra kvpool-server flags for every model, one string")
    args = p.parse_args(argv)
    entries, upstreams = [], []
    for i, item in enumerate(args.serve, start=1):
        name, sep, model = item.partition("=")
        if not sep or not name or not model:
            p.error(f"--serve {item!r}: write NAME=MODEL (a model folder, a Hugging Face id, or 'tiny')")
        port = args.port + i
        flags = ["--served-model-name", name, "--port", str(port), "--admin-port", str(port + 100),
                 *args.server_args.split()]  # fmt: skip
        entries.append({"name": name, "args": flags if model == "tiny" else ["--model", model, *flags]})
        upstreams.append(f"--upstream={name}=http://127.0.0.1:{port}")
    router = {"name": "router", "module": "kvpool_server.router", "args": ["--port", str(args.port), *upstreams]}
    return [*entries, router]


def run(servers: list[dict[str, Any]], poll_s: float = 0.5) -> int:
    procs = {
        s["name"]: subprocess.Popen([sys.executable, "-m", s.get("module", MODULES[0]), *map(str, s["args"])])
        for s in servers
    }

    asked = []  # a signal from outside: the group is being stopped, not failing

    def forward(signum: int, _frame: Any) -> None:
        for p in procs.values():
            if p.poll() is not None:
                continue
            p.send_signal(signum)

    def stop(signum: int, frame: Any) -> None:
        asked.append(signum)
        forward(signum, frame)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    while True:
        for name, p in procs.items():
            if p.poll() is not None:
                print(f"kvpool-group: {name!r} exited with {p.returncode}; stopping the group", file=sys.stderr)
                forward(signal.SIGTERM, None)
                for q in procs.values():
                    q.wait()
                # a server that ends on its own (its engine died, it crashed) fails the pod, whatever
                # its own exit status: the container ends in Error and Kubernetes restarts it
                return p.returncode if asked else (p.returncode or 1)
        time.sleep(poll_s)


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    sys.exit(run(local_group(argv) if argv else parse(os.environ.get(ENV))))


if __name__ == "__main__":
    main()
