"""Faults of a group pod's processes, with the group launcher as the pod runs it (router + two
servers, the CPU tier on): an engine core killed (SIGKILL) under load in each of four moments --
while its pool drains a shrink, while it maps a grow, while the tier stores blocks, while it loads
them back. (On the CPU the worker runs inside the engine core process: killing it kills both.)
Whatever the moment: no client waits forever (every stream ends, cut or failed, within a bound),
the dead server's admin API and /readyz never answer 200 again, and the launcher stops the pod's
other servers and exits non-zero -- the pod's container exits, so Kubernetes restarts it --
leaving no process behind."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest

from kvpool.offload import TIER_FILES, reap_stale
from tests.helm.test_monitoring import free_ports
from tests.server.conftest import TOKEN, wait_ready

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

MiB = 1 << 20


def lingering(procs: list[psutil.Process], within_s: float) -> list[int]:
    """The pids still alive (not zombies) after up to ``within_s``. A process may exit between
    ``is_running`` and ``status``: that one is gone, not an error (a run failed so, once, one
    second after the launcher exited)."""

    def alive(p: psutil.Process) -> bool:
        try:
            return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return False

    deadline = time.monotonic() + within_s
    while (left := [p.pid for p in procs if alive(p)]) and time.monotonic() < deadline:
        time.sleep(0.2)
    return left


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


class Pod:
    """The group pod's two servers through the launcher; ``a``'s admin API and a stream load on it."""

    def __init__(self, launcher: subprocess.Popen[bytes], port: int) -> None:
        self.launcher, self.port = launcher, port
        self.admin = httpx.Client(base_url=f"http://127.0.0.1:{port + 101}", timeout=30,
                                  headers={"Authorization": f"Bearer {TOKEN}"})  # fmt: skip
        self.ended: list[float] = []
        self.clients: list[threading.Thread] = []

    def snapshot(self) -> dict[str, Any]:
        return dict(self.admin.get("/kvpool").json())

    def set_limit(self, limit: int) -> dict[str, Any]:
        revision = self.snapshot()["pending"]["revision"] + 1
        return dict(self.admin.put("/kvpool/limit", json={"limit_bytes": limit, "revision": revision}).json())

    def complete(self, first: int, max_tokens: int, stream: bool = True) -> None:
        body = {"model": "a", "prompt": [list(range(first, first + 490))], "max_tokens": max_tokens,
                "stream": stream, "ignore_eos": True}  # fmt: skip
        with httpx.stream("POST", f"http://127.0.0.1:{self.port}/v1/completions", json=body, timeout=300) as r:
            for _ in r.iter_lines():
                pass

    def load(self, streams: int, first: int = 10) -> None:
        def one(i: int) -> None:
            with contextlib.suppress(httpx.HTTPError):  # cut: what a client of a dead engine should see
                self.complete(first + i, 600)
            self.ended.append(time.monotonic())

        self.clients = [threading.Thread(target=one, args=(i,), daemon=True) for i in range(streams)]
        for t in self.clients:
            t.start()

    def wait_for(self, what: str, ok: Callable[[dict[str, Any]], bool], timeout_s: float = 60) -> dict[str, Any]:
        deadline = time.monotonic() + timeout_s
        while not ok(snap := self.snapshot()):
            assert time.monotonic() < deadline, f"never reached: {what}"
            time.sleep(0.05)
        return snap


def mid_shrink(pod: Pod) -> str:
    pod.load(12)
    # more in use than the cut leaves: eight blocks (CI caught the shrink with 7.25 MiB mapped,
    # the prompts still arriving) let it apply at once, with nothing to drain
    pod.wait_for("the load in the pool", lambda s: s["used_blocks"] * s["block_bytes"] >= 10 * MiB)
    cut = pod.set_limit(8 * MiB)
    assert cut["status"] == "deferred", cut  # draining: the shrink is in flight
    return "the shrink deferred"


def mid_grow(pod: Pod) -> str:
    pod.set_limit(8 * MiB)
    pod.load(12)
    pod.wait_for("the pool full at its small limit", lambda s: s["used_blocks"] >= 8)
    grow = pod.set_limit(64 * MiB)
    assert grow["status"] in ("applied", "deferred"), grow
    return f"the grow {grow['status']}, {pod.snapshot()['mapped_bytes'] // MiB} MiB mapped"


def mid_tier_store(pod: Pod) -> str:
    pod.load(12)
    start = pod.wait_for("the load in the pool", lambda s: s["used_blocks"] >= 8)["offload"]["bytes_out"]
    snap = pod.wait_for("stores into the tier", lambda s: s["offload"]["bytes_out"] > start)
    return f"{(snap['offload']['bytes_out'] - start) // 1024} KiB stored in the last moment"


def mid_tier_load(pod: Pod) -> str:
    for i in range(6):  # six prompts computed, then trimmed out of the pool: they live in the tier
        pod.complete(10 + i, 1, stream=False)
    pod.admin.post("/kvpool/trim")
    start = pod.snapshot()["offload"]["bytes_in"]
    pod.load(6)  # the same prompts again: their prefill loads from the tier
    snap = pod.wait_for("loads from the tier", lambda s: s["offload"]["bytes_in"] > start)
    return f"{(snap['offload']['bytes_in'] - start) // 1024} KiB loaded back in the last moment"


MOMENTS: dict[str, Callable[[Pod], str]] = {
    "shrink": mid_shrink, "grow": mid_grow, "tier-store": mid_tier_store, "tier-load": mid_tier_load,
}  # fmt: skip


@pytest.mark.parametrize("moment", list(MOMENTS))
def test_an_engine_killed_mid_operation_fails_its_clients_fast_and_stops_the_pod(
    tiny_model: Path, tmp_path: Path, moment: str
) -> None:
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
        pod = Pod(launcher, port)
        seen = MOMENTS[moment](pod)
        engine_core(server_of(launcher, "a")).send_signal(signal.SIGKILL)
        killed = time.monotonic()
        while launcher.poll() is None:
            assert not answers_200(f"http://127.0.0.1:{port + 1}/readyz"), "a dead engine's server stayed ready"
            assert not answers_200(f"http://127.0.0.1:{port + 101}/kvpool"), "a dead engine's pool answered"
            assert time.monotonic() - killed < 120, "the launcher did not stop the pod"
            time.sleep(0.5)
        for t in pod.clients:
            t.join(timeout=max(1.0, 60 - (time.monotonic() - killed)))
        assert len(pod.ended) == len(pod.clients), "a client still waits on a dead engine"
        print(f"killed mid-{moment} ({seen}): {len(pod.clients)} clients released within "
              f"{max(pod.ended) - killed:.1f} s, the launcher exited {time.monotonic() - killed:.1f} s after "
              f"the kill with {launcher.returncode}")  # fmt: skip
        assert launcher.returncode != 0  # Kubernetes restarts the container
        assert lingering(everyone, within_s=5.0) == []
        # the killed worker's tier file is still there (/dev/shm outlives a container restart); the
        # restarted container's workers remove it, as nobody holds it (its pid may be alive again)
        left = sorted(tmp_path.glob(TIER_FILES))
        assert reap_stale(tmp_path) == left
        assert list(tmp_path.glob(TIER_FILES)) == []
    finally:  # a failed check kills the whole pod: SIGKILL gives the launcher no chance to stop
        if launcher.poll() is None:  # its servers, and a failed CI run left them running
            tree = psutil.Process(launcher.pid).children(recursive=True)
            launcher.kill()
            launcher.wait()
            for proc in tree:
                with contextlib.suppress(psutil.NoSuchProcess):
                    proc.kill()
