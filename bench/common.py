"""Shared benchmark plumbing: timing, a results folder, and one JSON file per benchmark."""

from __future__ import annotations

import json
import os
import platform
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

RESULTS = Path(os.environ.get("KVPOOL_RESULTS", "results"))


def best_of(fn: Callable[[], Any], repeat: int = 5) -> float:
    """Best wall time of ``repeat`` runs (seconds): the least disturbed by other load."""
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def write_result(name: str, data: dict[str, Any]) -> Path:
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"{name}.json"
    data = {"benchmark": name, "host": platform.node(), "machine": platform.machine(), **data}
    path.write_text(json.dumps(data, indent=2) + "\n")
    print(f"-> {path}")
    return path
