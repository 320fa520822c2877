"""The profile summary: py-spy's raw stacks of a real process tree, split by vLLM process role,
with the share of samples in our code and the hottest functions."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bench.profile_server import py_spy, role, summarise


def test_roles_follow_vllm_process_titles() -> None:
    assert role("VLLM::EngineCore") == "EngineCore"
    assert role("VLLM::Worker_TP0") == "Worker"
    assert role("/venv/bin/python -m kvpool_server --model m") == "APIServer"
    assert role("/venv/bin/python -m vllm.entrypoints.openai.api_server") == "APIServer"


@pytest.mark.slow
def test_a_recorded_process_tree_is_summarised_per_process(tmp_path: Path) -> None:
    pkg = tmp_path / "kvpool"  # a module under a kvpool/ path: its frames count as ours
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "hot.py").write_text(
        "import time\n"
        "def spin(seconds):\n"
        "    end = time.time() + seconds\n"
        "    while time.time() < end:\n"
        "        sum(range(1000))\n"
    )
    script = tmp_path / "tree.py"
    script.write_text(
        "import multiprocessing as mp\n"
        "from kvpool.hot import spin\n"
        "if __name__ == '__main__':\n"
        "    p = mp.get_context('spawn').Process(target=spin, args=(5,))\n"
        "    p.start(); spin(5); p.join()\n"
    )
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    proc = subprocess.Popen([sys.executable, str(script)], cwd=tmp_path, env=env)
    time.sleep(1.0)
    raw = tmp_path / "raw.txt"
    subprocess.run([py_spy(), "record", "--pid", str(proc.pid), "--subprocesses", "--nonblocking", "--format",
                    "raw", "--rate", "50", "--duration", "2", "--output", str(raw)], check=True,
                   capture_output=True)  # fmt: skip
    proc.wait(timeout=30)
    out = summarise(raw, top=3)
    assert len(out) == 2  # the parent and its spawned child, each under its own command line
    for stats in out.values():
        assert stats["samples"] > 20
        assert stats["ours_share"] > 0.9
        assert "kvpool/hot.py" in stats["top_self"][0][0]
