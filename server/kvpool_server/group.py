"""The group launcher: every model's kvpool-server in one container (the device-plugin mode, where
only one container can hold the pod's GPU).

    KVPOOL_GROUP_SERVERS='[{"name": "llama", "args": ["--model", "...", "--port", "8000", ...]}, ...]'
    python -m kvpool_server.group

Starts one ``python -m kvpool_server`` per entry, forwards SIGTERM/SIGINT to all (each drains its
requests), and exits as soon as any server exits -- with its status -- after stopping the others,
so Kubernetes restarts the pod rather than leaving a group with a model missing.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from typing import Any

ENV = "KVPOOL_GROUP_SERVERS"


def parse(raw: str | None) -> list[dict[str, Any]]:
    """The launcher's one input; errors say what to fix."""
    if not raw:
        sys.exit(f"kvpool-group: error: set {ENV} to a JSON list of {{'name', 'args'}} objects")
    try:
        servers = json.loads(raw)
    except json.JSONDecodeError as e:
        sys.exit(f"kvpool-group: error: {ENV} is not JSON: {e}")
    if not isinstance(servers, list) or not servers:
        sys.exit(f"kvpool-group: error: {ENV} must be a non-empty JSON list")
    for i, s in enumerate(servers):
        if not isinstance(s, dict) or not isinstance(s.get("name"), str) or not isinstance(s.get("args"), list):
            sys.exit(f"kvpool-group: error: {ENV}[{i}] needs a string 'name' and a list 'args'")
    return servers


def run(servers: list[dict[str, Any]], poll_s: float = 0.5) -> int:
    procs = {
        s["name"]: subprocess.Popen([sys.executable, "-m", "kvpool_server", *map(str, s["args"])]) for s in servers
    }

    def forward(signum: int, _frame: Any) -> None:
        for p in procs.values():
            if p.poll() is None:
                p.send_signal(signum)

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    while True:
        for name, p in procs.items():
            if p.poll() is not None:
                print(f"kvpool-group: server {name!r} exited with {p.returncode}; stopping the group", file=sys.stderr)
                forward(signal.SIGTERM, None)
                for q in procs.values():
                    q.wait()
                return p.returncode or 0
        time.sleep(poll_s)


def main() -> None:
    sys.exit(run(parse(os.environ.get(ENV))))


if __name__ == "__main__":
    main()
