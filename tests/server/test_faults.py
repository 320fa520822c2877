"""Faults of a group pod's processes, with the group launcher as the pod runs it (router + two
servers, the CPU tier on): an engine core killed (SIGKILL) while its pool drains a shrink under
load. No client waits forever (every stream ends, cut or failed, within a bound), the dead
server's admin API and /readyz never answer 200 again, and the launcher stops the pod's other
servers and exits non-zero -- the pod's container exits, so Kubernetes restarts it -- leaving no
process behind."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import psutil
import pytest

from tests.helm.test_monitoring import free_ports
from tests.server.conftest import TOKEN, wait_ready

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

MiB = 1 << 20


def engine_core(server: psutil.Process) -> psutil.Process:
    (core,) = [c for c in server.children() if "EngineCore" in " ".join(c.cmdline()) or "EngineCore" in c.name()]
    return core


def server_of(launcher: subprocess.Popen[bytes], model: str) -> psutil.Process:
    def serves(argv: list[str]) -> bool:
        return "kvpool_server" in argv and argv[argv.index("--served-model-name") + 1] == model

    (proc,) = [c for c in psutil.Process(launcher.pid).children() if serves(c.cmdline())]
    return proc


def answers_200(url: str) -> bool:
    try:
        return httpx.get(url, timeout=5, headers={"Authorization": f"Bearer {TOKEN}"}).status_code == 200
    except httpx.HTTPError:
        return False


def test_an_engine_killed_mid_shrink_fails_its_clients_fast_and_stops_the_pod(tiny_model: Path, tmp_path: Path) -> None:
    (tmp_path / "token").write_text(TOKEN)
    port = free_ports(3)
    extra = (f"--limit-bytes 64Mi --virtual-bytes 256Mi --admin-token-file {tmp_path / 'token'} "
             f"--offload-bytes 32Mi --offload-dir {tmp_path}")  # fmt: skip
    cmd = [sys.executable, "-m", "kvpool_server.group", "--serve", f"a={tiny_model}", "--serve", f"b={tiny_model}",
           "--port", str(port), "--server-args", extra]  # fmt: skip
    log = tmp_path / "group.log"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1"}
    launcher = subprocess.Popen(cmd, stdout=log.open("wb"), stderr=subprocess.STDOUT, env=env)
    try:
        wait_ready(launcher, f"http://127.0.0.1:{port}", log, timeout_s=300)
        everyone = [psutil.Process(launcher.pid), *psutil.Process(launcher.pid).children(recursive=True)]
        server = server_of(launcher, "a")
        admin = httpx.Client(base_url=f"http://127.0.0.1:{port + 101}", timeout=30,
                             headers={"Authorization": f"Bearer {TOKEN}"})  # fmt: skip
        ended: list[float] = []

        def stream(i: int) -> None:
            body = {"model": "a", "prompt": [list(range(10 + i, 500 + i))], "max_tokens": 600, "stream": True,
                    "ignore_eos": True}  # fmt: skip
            try:
                with httpx.stream("POST", f"http://127.0.0.1:{port}/v1/completions", json=body, timeout=300) as r:
                    for _ in r.iter_lines():
                        pass
            except httpx.HTTPError:
                pass  # cut: what a client of a dead engine should see
            ended.append(time.monotonic())

        clients = [threading.Thread(target=stream, args=(i,), daemon=True) for i in range(12)]
        for t in clients:
            t.start()
        deadline = time.monotonic() + 60
        while admin.get("/kvpool").json()["used_blocks"] < 8:
            assert time.monotonic() < deadline, "the load never reached the pool"
            time.sleep(0.1)
        snap = admin.get("/kvpool").json()
        cut = admin.put("/kvpool/limit", json={"limit_bytes": 8 * MiB, "revision": snap["pending"]["revision"] + 1})
        assert cut.json()["status"] == "deferred", cut.json()  # draining: the shrink is in flight
        engine_core(server).send_signal(signal.SIGKILL)
        killed = time.monotonic()
        while launcher.poll() is None:
            assert not answers_200(f"http://127.0.0.1:{port + 1}/readyz"), "a dead engine's server stayed ready"
            assert not answers_200(f"http://127.0.0.1:{port + 101}/kvpool"), "a dead engine's pool answered"
            assert time.monotonic() - killed < 120, "the launcher did not stop the pod"
            time.sleep(0.5)
        for t in clients:
            t.join(timeout=max(1.0, 60 - (time.monotonic() - killed)))
        assert len(ended) == len(clients), "a client still waits on a dead engine"
        print(f"clients released within {max(ended) - killed:.1f} s, the launcher exited "
              f"{time.monotonic() - killed:.1f} s after the kill with {launcher.returncode}")  # fmt: skip
        assert launcher.returncode != 0  # Kubernetes restarts the container
        time.sleep(1)
        assert [p.pid for p in everyone if p.is_running() and p.status() != psutil.STATUS_ZOMBIE] == []
    finally:
        if launcher.poll() is None:
            launcher.kill()
            launcher.wait()
