"""The benchmark's server plumbing: ports that cannot collide, and a server found on its port is
checked to serve the model it was started for."""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from bench.servers import check_serves, distinct_ports


def test_ports_chosen_together_are_distinct_and_free() -> None:
    ports = distinct_ports(12)
    assert len(set(ports)) == 12
    for p in ports:
        with socket.socket() as s:
            s.bind(("127.0.0.1", p))


class _Models(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        body = json.dumps({"object": "list", "data": [{"id": "a", "object": "model"}]}).encode()
        self.send_response(200 if self.path == "/v1/models" else 404)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def serving_a() -> Iterator[str]:
    """An OpenAI-style /v1/models over real HTTP that lists model ``a`` only."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Models)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_a_server_on_the_port_that_serves_another_model_is_refused(serving_a: str) -> None:
    check_serves(serving_a, "a")
    with pytest.raises(RuntimeError, match="serves \\['a'\\], not 'b'"):
        check_serves(serving_a, "b")
    with pytest.raises(RuntimeError, match="serves no models \\(HTTP 404\\), not 'a'"):
        check_serves(serving_a + "/elsewhere", "a")  # an admin port, say: no /v1/models
