"""The group launcher (device-plugin mode: every model's server in one container): clear errors
for a bad configuration, and a server that dies takes the group down with its status, so
Kubernetes restarts the pod instead of running a group with a model missing."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest


def launch(value: str | None, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "KVPOOL_GROUP_SERVERS"}
    if value is not None:
        env["KVPOOL_GROUP_SERVERS"] = value
    return subprocess.run([sys.executable, "-m", "kvpool_server.group"], env=env, capture_output=True, text=True,
                          timeout=timeout)  # fmt: skip


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (None, "set KVPOOL_GROUP_SERVERS"),
        ("{not json", "is not JSON"),
        ("[]", "non-empty JSON list"),
        ('[{"name": "a"}]', "KVPOOL_GROUP_SERVERS[0] needs a string 'name' and a list 'args'"),
    ],
)
def test_a_bad_group_configuration_is_a_clear_error(value: str | None, message: str) -> None:
    out = launch(value)
    assert out.returncode != 0
    assert message in out.stderr


def test_a_server_that_exits_stops_the_group_with_its_status() -> None:
    servers = [{"name": "a", "args": ["--port", "0"]}, {"name": "b", "args": ["--limit-bytes", "lots"]}]
    out = launch(json.dumps(servers))
    assert out.returncode != 0
    assert "--port (env KVPOOL_PORT)" in out.stderr or "--limit-bytes" in out.stderr  # the server's own error
    assert "exited with" in out.stderr
    assert "stopping the group" in out.stderr


def test_serve_flags_make_a_local_group_behind_the_router_port() -> None:
    from kvpool_server.group import local_group

    entries = local_group(["--serve", "smol=/models/smol", "--serve", "tiny=tiny", "--port", "7000"])
    assert entries == [
        {"name": "smol", "args": ["--model", "/models/smol", "--served-model-name", "smol", "--port", "7001",
                                    "--admin-port", "7101"]},
        {"name": "tiny", "args": ["--served-model-name", "tiny", "--port", "7002", "--admin-port", "7102"]},
        {"name": "router", "module": "kvpool_server.router",
         "args": ["--port", "7000", "--upstream=smol=http://127.0.0.1:7001", "--upstream=tiny=http://127.0.0.1:7002"]},
    ]  # fmt: skip


def test_a_serve_flag_without_a_model_names_the_form() -> None:
    out = subprocess.run([sys.executable, "-m", "kvpool_server.group", "--serve", "smol"], capture_output=True,
                         text=True, timeout=60)  # fmt: skip
    assert out.returncode == 2
    assert "--serve 'smol': write NAME=MODEL" in out.stderr


def test_an_unknown_module_is_refused() -> None:
    out = launch(json.dumps([{"name": "x", "module": "os", "args": []}]))
    assert out.returncode != 0
    assert "KVPOOL_GROUP_SERVERS[0].module must be one of kvpool_server, kvpool_server.router" in out.stderr
