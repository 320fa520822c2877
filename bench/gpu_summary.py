"""The GPU check's bookends (run by bench/gpu_check.sh; only the standard library, torch optional).

``preflight``: the interpreter, the modules the check needs and their versions, the device --
printed and written to ``gpu_preflight.json``; exits 1 naming what is missing, before any device
time goes into a run that cannot finish. ``summary``: the preflight, every gpu test's outcome
(pytest's JUnit XML) and the benchmark files, merged into ``gpu_check.json``.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import json
import platform
import sys
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

from bench.common import RESULTS, write_result

#: module -> distribution whose version is reported
NEEDED = {"torch": "torch", "triton": "triton", "cuda.bindings.driver": "cuda-bindings", "pytest": "pytest",
          "hypothesis": "hypothesis"}  # fmt: skip


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def preflight() -> dict[str, Any]:
    found, missing = {}, []
    for module, dist in NEEDED.items():
        try:
            importlib.import_module(module)
            found[dist] = _version(dist) or "?"
        except Exception as e:  # an ImportError, or a binding that finds no driver library
            missing.append(f"{module} ({type(e).__name__}: {e})")
    out: dict[str, Any] = {"python": platform.python_version(), "packages": found, "missing": missing}
    if "torch" in found:
        import torch

        out["cuda_available"] = torch.cuda.is_available()
        out["device"] = torch.cuda.get_device_name() if out["cuda_available"] else None
    return out


def outcomes(junit: Path) -> dict[str, str]:
    """``{test id: passed | failed | error | skipped: reason}`` from pytest's JUnit XML."""
    if not junit.exists():
        return {}
    out = {}
    for case in ET.parse(junit).getroot().iter("testcase"):
        name = f"{case.get('classname')}::{case.get('name')}"
        outcome = "passed"
        for tag in ("failure", "error", "skipped"):
            el = case.find(tag)
            if el is not None:
                outcome = f"{tag}: {(el.get('message') or '')[:200]}"
        out[name] = outcome
    return out


def main(argv: list[str] | None = None) -> None:
    mode = (argv or sys.argv[1:] or ["summary"])[0]
    pre = preflight()
    if mode == "preflight":
        print(json.dumps(pre, indent=2))
        write_result("gpu_preflight", pre)
        if pre["missing"]:
            raise SystemExit("gpu_check: missing " + "; ".join(pre["missing"]))
        return
    files = {name: RESULTS / f"{name}.json" for name in ("gpu", "gpu_attention")}
    parts = {name: json.loads(path.read_text()) for name, path in files.items() if path.exists()}
    outcome = outcomes(RESULTS / "gpu_tests.xml")
    failed = [t for t, o in outcome.items() if not o.startswith(("passed", "skipped"))]
    summary = {"preflight": pre, "tests": outcome, "failed_tests": failed, **parts}
    write_result("gpu_check", summary)
    print(f"gpu tests: {len(outcome) - len(failed)} of {len(outcome)} passed or skipped; failed: {failed or 'none'}")


if __name__ == "__main__":
    main()
