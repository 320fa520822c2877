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


def ttft_percentiles(ttfts: list[float]) -> dict[str, float]:
    """p50 and p99 of the times to first token (seconds)."""
    s = sorted(ttfts)
    return {"ttft_p50_s": s[len(s) // 2], "ttft_p99_s": s[min(len(s) - 1, int(len(s) * 0.99))]}


def compare(name: str, rounds: dict[str, list[dict[str, float]]], args: dict[str, Any]) -> None:
    """Medians per configuration, kvpool / stock ratios printed, the JSON result written."""
    import statistics

    med = {k: {m: statistics.median(r[m] for r in v) for m in v[0]} for k, v in rounds.items()}
    ratios = {m: med["kvpool"][m] / med["stock"][m] for m in med["stock"]}
    for config, metrics in med.items():
        print(f"{config:>7}: " + "  ".join(f"{m} {v:.4g}" for m, v in metrics.items()))
    print("kvpool / stock: " + "  ".join(f"{k} {v:.3f}x" for k, v in ratios.items()))
    write_result(name, {"args": args, "median": med, "ratio_kvpool_over_stock": ratios, "rounds": rounds})


def paired_ratios(name: str, rounds: dict[str, list[dict[str, float]]], over: str, base: str,
                  args: dict[str, Any]) -> dict[str, dict[str, float]]:  # fmt: skip
    """``over`` / ``base`` per metric from rounds run in pairs: the median of the per-pair ratios,
    their range, and a bootstrap 95% interval of that median; printed, and written as JSON."""
    import random
    import statistics

    rng, out = random.Random(0), {}
    for metric in rounds[base][0]:
        ratios = [o[metric] / b[metric] for o, b in zip(rounds[over], rounds[base], strict=True)]
        boot = sorted(statistics.median(rng.choices(ratios, k=len(ratios))) for _ in range(2000))
        out[metric] = {"median": statistics.median(ratios), "min": min(ratios), "max": max(ratios),
                       "ci95_low": boot[50], "ci95_high": boot[1949]}  # fmt: skip
        r = out[metric]
        print(f"{over} / {base} {metric}: {r['median']:.3f}x  (range {r['min']:.3f}-{r['max']:.3f}, "
              f"95% CI {r['ci95_low']:.3f}-{r['ci95_high']:.3f}, {len(ratios)} pairs)")  # fmt: skip
    write_result(name, {"args": args, f"ratio_{over}_over_{base}": out, "rounds": rounds})
    return out
