"""The GPU check starts on the first try on the lent machine: it collects only the gpu test files,
and everything it runs imports only what that machine's python3 holds (the standard library,
torch, triton, cuda-bindings, pytest, hypothesis, numpy) -- no vLLM, server or operator package."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).parents[2]
OURS = ("kvpool", "bench", "tests")
DEVICE_HAS = {"torch", "triton", "cuda", "pytest", "hypothesis", "numpy"}
BENCH_MODULES = ["bench/gpu_bench.py", "bench/gpu_attention.py", "bench/gpu_summary.py"]


def gpu_test_files() -> list[Path]:
    """The files bench/gpu_check.sh selects (the same grep)."""
    out = subprocess.run(["grep", "-rl", "--include=test_*.py", "^pytestmark = pytest.mark.gpu", "tests"],
                         cwd=ROOT, capture_output=True, text=True, check=True).stdout  # fmt: skip
    return sorted(ROOT / line for line in out.split())


def module_file(name: str) -> Path | None:
    base = ROOT.joinpath(*name.split("."))
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.exists():
            return candidate
    return None


def imported(path: Path) -> set[str]:
    """Absolute names of every module ``path`` imports (relative imports resolved). In a conftest
    only the module-level imports count: a fixture's own imports run only for tests that use it."""
    package = ".".join(path.relative_to(ROOT).with_suffix("").parts[:-1] if path.name != "__init__.py"
                       else path.relative_to(ROOT).parts[:-1])  # fmt: skip
    names = set()
    tree = ast.parse(path.read_text())
    nodes = tree.body if path.name == "conftest.py" else ast.walk(tree)
    for node in nodes:
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*parent, base] if base else parent)
            names.add(base)
            names |= {f"{base}.{a.name}" for a in node.names if module_file(f"{base}.{a.name}")}
    return names - {"__future__"}


def third_party_closure(start: list[Path]) -> dict[str, set[str]]:
    """Top-level third-party package -> the files of ours that import it, over the import closure."""
    seen, todo, out = set(), list(start), {}
    while todo:
        path = todo.pop()
        if path in seen:
            continue
        seen.add(path)
        for name in imported(path):
            top = name.split(".")[0]
            if top in OURS:
                parts = name.split(".")
                for i in range(len(parts), 0, -1):  # the package's __init__ files run too
                    if (f := module_file(".".join(parts[:i]))) is not None:
                        todo.append(f)
            elif top not in sys.stdlib_module_names:
                out.setdefault(top, set()).add(str(path.relative_to(ROOT)))
    return out


def conftests(files: list[Path]) -> list[Path]:
    """The conftest.py files pytest loads for ``files``: those of their folders up to tests/."""
    tests = ROOT / "tests"
    return sorted({p / "conftest.py" for f in files for p in f.parents
                   if (p == tests or tests in p.parents) and (p / "conftest.py").exists()})  # fmt: skip


def test_the_check_selects_the_gpu_test_files_and_pytest_collects_them() -> None:
    files = gpu_test_files()
    assert {"test_cuda.py", "test_store_cuda.py"} <= {f.name for f in files}
    done = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--collect-only", "-q",
                           *map(str, files)], cwd=ROOT, capture_output=True, text=True)  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    collected = re.search(r"(\d+) tests? collected", done.stdout)
    assert collected, done.stdout
    assert int(collected.group(1)) >= 6, done.stdout


def test_everything_the_check_runs_imports_only_what_the_gpu_machine_holds() -> None:
    files = gpu_test_files()
    start = [*files, *conftests(files), *(ROOT / m for m in BENCH_MODULES)]
    foreign = {top: users for top, users in third_party_closure(start).items() if top not in DEVICE_HAS}
    assert foreign == {}


def test_the_closure_check_sees_a_foreign_import() -> None:
    found = third_party_closure([ROOT / "bench" / "bench_server.py"])
    assert "httpx" in found
