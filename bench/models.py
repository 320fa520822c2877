"""The models the side-by-side benchmarks run: the tiny random model (built here in seconds), the
real default model (``make model``'s folder) or any model folder."""

from __future__ import annotations

import os
from pathlib import Path


def resolve_model(name: str) -> str:
    """``tiny`` (built here, seconds), ``smollm2`` (``make model``'s folder) or a path."""
    if name == "tiny":
        import tempfile

        from kvpool.vllm.launch.tiny_model import build_tiny_model

        return str(build_tiny_model(Path(tempfile.gettempdir()) / "kvpool-bench-tiny"))
    if name == "smollm2":
        default = Path.home() / ".cache/kvpool/models/SmolLM2-135M-Instruct"
        path = Path(os.environ.get("KVPOOL_SMOLLM2_DIR", default))
        if not (path / "config.json").exists():
            raise SystemExit(f"--model smollm2: {path} does not hold the model; run `make model` first")
        return str(path)
    return name
