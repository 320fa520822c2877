"""The GPU check's summary reads every gpu test's outcome from pytest's own JUnit XML."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from bench.gpu_summary import outcomes, preflight


def test_outcomes_come_from_a_real_pytest_junit_file(tmp_path: Path) -> None:
    (tmp_path / "test_x.py").write_text(
        "import pytest\n"
        "def test_ok(): pass\n"
        "def test_bad(): assert 1 == 2\n"
        "@pytest.mark.skip(reason='no CUDA here')\n"
        "def test_skip(): pass\n"
    )
    junit = tmp_path / "out.xml"
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--junitxml={junit}", "--rootdir",
           str(tmp_path), str(tmp_path / "test_x.py")]  # fmt: skip
    subprocess.run(cmd, capture_output=True, cwd=tmp_path)
    out = {name.rpartition("::")[2]: outcome for name, outcome in outcomes(junit).items()}
    assert out["test_ok"] == "passed"
    assert out["test_bad"].startswith("failure:")
    assert out["test_skip"] == "skipped: no CUDA here"


def test_a_missing_junit_file_means_no_tests_ran(tmp_path: Path) -> None:
    assert outcomes(tmp_path / "absent.xml") == {}


def test_preflight_names_the_interpreter_and_what_it_lacks() -> None:
    pre = preflight()
    assert pre["python"] == f"{sys.version_info.major}.{sys.version_info.minor}.{sys.version_info.micro}"
    assert "torch" in pre["packages"]
    assert "pytest" in pre["packages"]
    assert pre["cuda_available"] is False or pre["device"]
    assert all("(" in m for m in pre["missing"])  # each names its module and the error
