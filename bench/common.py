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


def ratio_stats(over: list[dict[str, float]], base: list[dict[str, float]]) -> dict[str, dict[str, float]]:
    """Per metric, from rounds run in pairs (the same workload seed in both): the median of the
    per-pair ratios ``over / base``, their range, and a bootstrap 95% interval of that median."""
    import random
    import statistics

    rng, out = random.Random(0), {}
    for metric in base[0]:
        ratios = [o[metric] / b[metric] for o, b in zip(over, base, strict=True)]
        boot = sorted(statistics.median(rng.choices(ratios, k=len(ratios))) for _ in range(2000))
        out[metric] = {"median": statistics.median(ratios), "min": min(ratios), "max": max(ratios),
                       "ci95_low": boot[50], "ci95_high": boot[1949], "pairs": len(ratios)}  # fmt: skip
    return out


def print_ratios(over: str, base: str, stats: dict[str, dict[str, float]]) -> None:
    for metric, r in stats.items():
        print(f"{over} / {base} {metric}: {r['median']:.3f}x  (range {r['min']:.3f}-{r['max']:.3f}, "
              f"95% CI {r['ci95_low']:.3f}-{r['ci95_high']:.3f}, {r['pairs']:.0f} pairs)")  # fmt: skip


def paired_ratios(name: str, rounds: dict[str, list[dict[str, float]]], base: str,
                  args: dict[str, Any], **extra: Any) -> dict[str, dict[str, dict[str, float]]]:  # fmt: skip
    """Every configuration against ``base`` (``ratio_stats``), printed and written as JSON with
    each configuration's median per metric and every round."""
    import statistics

    ratios = {}
    for config, runs in rounds.items():
        med = {m: statistics.median(r[m] for r in runs) for m in runs[0]}
        print(f"{config:>14}: " + "  ".join(f"{m} {v:.4g}" for m, v in med.items()))
    for over in rounds:
        if over != base:
            ratios[over] = ratio_stats(rounds[over], rounds[base])
            print_ratios(over, base, ratios[over])
    write_result(name, {"args": args, "base": base, "ratios": ratios, "rounds": rounds, **extra})
    return ratios


def flatten(config: Any, prefix: str = "") -> dict[str, Any]:
    """A nested config (dicts of JSON values) as ``{"a.b.c": value}``."""
    if not isinstance(config, dict):
        return {prefix: config}
    out: dict[str, Any] = {}
    for k, v in config.items():
        out |= flatten(v, f"{prefix}.{k}" if prefix else str(k))
    return out


#: settings that name one run (random per start), not a choice: never compared
RUN_IDENTITY = ("instance_id", "engine_id", "control_address", "VLLM_OBJECT_STORAGE_SHM_BUFFER_NAME")


def config_differences(configs: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Every setting whose value differs between the named configs: ``{key: {name: value}}``."""
    flat = {name: flatten(c) for name, c in configs.items()}
    keys = sorted(k for k in set().union(*flat.values()) if k.rpartition(".")[2] not in RUN_IDENTITY)
    return {k: {n: f.get(k) for n, f in flat.items()} for k in keys if len({repr(f.get(k)) for f in flat.values()}) > 1}


def print_config_differences(diff: dict[str, dict[str, Any]]) -> None:
    """Side by side: one line per differing setting, one column per config."""
    if not diff:
        print("engine configs: identical")
        return
    names = list(next(iter(diff.values())))
    print("engine settings that differ:\n  " + " | ".join(["setting", *names]))
    for key, values in diff.items():
        print("  " + " | ".join([key, *(str(values[n])[:60] for n in names)]))
