"""The embedded tiny model: servers that start together (a group pod's two) build it into one
folder at once, and each must get a whole copy."""

from __future__ import annotations

import hashlib
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

BUILD = "import sys; from pathlib import Path; from kvpool.vllm.launch.tiny_model import build_tiny_model; " \
        "print(build_tiny_model(Path(sys.argv[1])))"  # fmt: skip


def digest(folder: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir())}


def test_concurrent_builds_into_one_folder_leave_one_whole_copy(tmp_path: Path) -> None:
    out = tmp_path / "cache" / "tiny-model"
    procs = [subprocess.Popen([sys.executable, "-c", BUILD, str(out)], stdout=subprocess.PIPE, text=True)
             for _ in range(3)]  # fmt: skip
    results = [p.communicate(timeout=240)[0].strip() for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0]
    assert results == [str(out)] * 3
    assert [p.name for p in out.parent.iterdir()] == ["tiny-model"]  # no half-built copies left
    reference = tmp_path / "alone"
    subprocess.run([sys.executable, "-c", BUILD, str(reference)], check=True, capture_output=True, timeout=240)
    assert digest(out) == digest(reference)  # whole, and the same bytes as a copy built alone
