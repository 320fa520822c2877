"""Test boundaries: a test file that touches CUDA bindings must be marked ``gpu`` as a whole, so
CPU-only CI skips it with the reason instead of failing at import."""

from __future__ import annotations

import re
from pathlib import Path

TESTS = Path(__file__).parent
CUDA_IMPORT = re.compile(r"^\s*(from|import)\s+(cuda\b|kvpool\.vmm\.cuda\b)", re.M)


def test_every_test_file_importing_cuda_bindings_is_marked_gpu() -> None:
    offenders = [
        str(path.relative_to(TESTS))
        for path in TESTS.rglob("test_*.py")
        if CUDA_IMPORT.search(path.read_text()) and "pytestmark = pytest.mark.gpu" not in path.read_text()
    ]
    assert offenders == []


def test_the_cuda_backend_tests_are_found_by_that_check() -> None:
    assert CUDA_IMPORT.search((TESTS / "kvpool" / "vmm" / "test_cuda.py").read_text())
