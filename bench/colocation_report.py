"""The colocation benchmark's report: per-model and overall figures, elastic / static ratios as a
Markdown table, the JSON result, and two PNGs (memory over time with the load; TTFT CDF)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

MiB = 1 << 20


def pct(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(len(s) * q))] if s else float("nan")


def summarize(run: dict[str, Any], model: str | None) -> dict[str, float]:
    outs = [o for o in run["outcomes"] if model is None or o["model"] == model]
    ok = [o for o in outs if o["ok"]]
    ttft, lat = [o["ttft_s"] for o in ok], [o["latency_s"] for o in ok]
    finals = [f for m, f in run["final"].items() if model is None or m == model]
    resizes = [z for r in run["rounds"] for z in r["resizes"] if model is None or z["model"] == model]
    moving = [r["seconds"] for r in run["rounds"] if r["resizes"]]  # rounds that resized: incl. shrink waits
    return {
        "requests": len(outs), "failed": len(outs) - len(ok),
        "ttft_p50_s": pct(ttft, 0.5), "ttft_p99_s": pct(ttft, 0.99),
        "latency_p50_s": pct(lat, 0.5), "latency_p99_s": pct(lat, 0.99),
        "throughput_tok_s": sum(o["tokens"] for o in ok) / run["wall_s"],
        "preemptions": sum(f["demand"]["preemptions"] for f in finals),
        "resizes": len(resizes),
        "resize_round_p50_s": pct(moving, 0.5) if moving else 0.0,
        "tier_hits": sum((f.get("offload") or {}).get("hits", 0) for f in finals),
    }  # fmt: skip


def table(summary: dict[str, dict[str, dict[str, float]]]) -> str:
    keys = ["ttft_p50_s", "ttft_p99_s", "latency_p50_s", "latency_p99_s", "throughput_tok_s", "preemptions",
            "failed", "resizes", "resize_round_p50_s", "tier_hits"]  # fmt: skip
    lines = ["| scope | metric | static | elastic | elastic / static |", "|---|---|---|---|---|"]
    for scope in summary["static"]:
        for k in keys:
            s, e = summary["static"][scope][k], summary["elastic"][scope][k]
            ratio = f"{e / s:.2f}x" if s else "-"
            lines.append(f"| {scope} | {k} | {s:.4g} | {e:.4g} | {ratio} |")
    return "\n".join(lines)


def plots(results: dict[str, Any], out: Path) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 1, figsize=(10, 7), sharex=True)
    for ax, (config, run) in zip(axes, results.items(), strict=True):
        t = [s["t"] for s in run["samples"]]
        load = ax.twinx()
        for model, color in (("a", "tab:blue"), ("b", "tab:orange")):
            ax.plot(t, [s[model]["limit"] / MiB for s in run["samples"]], color=color, ls="--", label=f"{model} limit")
            ax.plot(t, [s[model]["mapped"] / MiB for s in run["samples"]], color=color, label=f"{model} mapped")
            busy = [s[model]["running"] + s[model]["waiting"] for s in run["samples"]]
            load.fill_between(t, busy, color=color, alpha=0.12, step="post")
        ax.set_title(config)
        ax.set_ylabel("KV MiB")
        load.set_ylabel("requests in the engine")
        ax.legend(loc="upper left", fontsize=8)
    axes[-1].set_xlabel("seconds")
    fig.tight_layout()
    mem = out / "bench_colocation_memory.png"
    fig.savefig(mem, dpi=110)
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for config, run in results.items():
        ttft = sorted(o["ttft_s"] for o in run["outcomes"] if o["ok"])
        ax.plot(ttft, [(i + 1) / len(ttft) for i in range(len(ttft))], label=config)
    ax.set_xscale("log")
    ax.set_xlabel("TTFT (s)")
    ax.set_ylabel("fraction of requests")
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    cdf = out / "bench_colocation_ttft_cdf.png"
    fig.savefig(cdf, dpi=110)
    return [str(mem), str(cdf)]


def report(results: dict[str, Any], args: dict[str, Any], out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    scopes: list[str | None] = [None, "a", "b"]
    summary = {c: {(s or "overall"): summarize(r, s) for s in scopes} for c, r in results.items()}
    static, elastic = summary["static"]["overall"], summary["elastic"]["overall"]
    keys = ("ttft_p50_s", "ttft_p99_s", "latency_p99_s", "throughput_tok_s")
    ratio = {k: elastic[k] / static[k] for k in keys if static[k]}
    pngs = plots(results, out)
    print(table(summary))
    print("elastic / static (overall): " + "  ".join(f"{k} {v:.2f}x" for k, v in ratio.items()))
    print(f"controller: {args['controller']}")
    path = out / "bench_colocation.json"
    data = {"benchmark": "bench_colocation", "args": args, "summary": summary, "ratio_elastic_over_static": ratio,
            "plots": pngs, "runs": results}  # fmt: skip
    path.write_text(json.dumps(data, indent=1))
    print(f"-> {path} {' '.join(pngs)}")
