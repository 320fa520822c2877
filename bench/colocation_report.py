"""The colocation benchmark's report: per workload, one table with every configuration side by
side (overall, ratios to static of the same tier setting), one of each model's p99 TTFT, compute
saturation, the issue's goals checked, the JSON result, and two PNGs per workload (memory per
model over time with the load; TTFT CDF per configuration)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

MiB = 1 << 20
COLUMNS = ("ttft_p50_s", "ttft_p99_s", "latency_p99_s", "throughput_tok_s", "preemptions", "shrink_preemptions",
           "failed", "resizes_per_model_min", "mib_mapped")  # fmt: skip


def pct(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(len(s) * q))] if s else float("nan")


def summarize(run: dict[str, Any], model: str | None) -> dict[str, float]:
    outs = [o for o in run["outcomes"] if model is None or o["model"] == model]
    ok = [o for o in outs if o["ok"]]
    ttft, lat = [o["ttft_s"] for o in ok], [o["latency_s"] for o in ok]
    models = [m for m in run["final"] if model is None or m == model]
    resizes = [z for r in run["rounds"] for z in r["resizes"] if z["model"] in models]
    mapped = 0
    for prev, cur in zip(run["samples"], run["samples"][1:], strict=False):
        mapped += sum(max(0, cur[m]["physical"] - prev[m]["physical"]) for m in models)
    return {
        "requests": len(outs), "failed": len(outs) - len(ok),
        "ttft_p50_s": pct(ttft, 0.5), "ttft_p99_s": pct(ttft, 0.99), "latency_p99_s": pct(lat, 0.99),
        "throughput_tok_s": sum(o["tokens"] for o in ok) / run["wall_s"],
        "preemptions": sum(run["final"][m]["demand"]["preemptions"] for m in models),
        # of them, made to finish a shrink (preempt_after_s), not for lack of memory
        "shrink_preemptions": sum(run["final"][m].get("shrink_preemptions", 0) for m in models),
        "resizes_per_model_min": len(resizes) / len(models) / (run["wall_s"] / 60),
        "mib_mapped": mapped / MiB,
        "tier_hits": sum((run["final"][m].get("offload") or {}).get("hits", 0) for m in models),
        "cpu_utilisation": sum(run["cpu_utilisation"][m] for m in models) / len(models),
        "max_waiting": max((s[m]["waiting"] for s in run["samples"] for m in models), default=0),
        "drain_s": run["wall_s"] - run["duration_s"],
    }  # fmt: skip


def baseline(config: str) -> str:
    return "static+tier" if config.endswith("+tier") else "static"


def ratio(x: float, base: float) -> str:
    return f" ({x / base:.2f}x)" if base and base == base and x == x else ""


def tables(name: str, summary: dict[str, dict[str, dict[str, float]]]) -> str:
    models = [s for s in next(iter(summary.values())) if s != "overall"]
    head = "| config | " + " | ".join(COLUMNS) + " |"
    lines = [f"#### {name}", "", head, "|---" * (len(COLUMNS) + 1) + "|"]
    for config, scopes in summary.items():
        base = summary.get(baseline(config), {}).get("overall", {})
        cells = [f"{scopes['overall'][k]:.3g}" + (ratio(scopes["overall"][k], base.get(k, 0)) if k in COLUMNS[:4]
                 else "") for k in COLUMNS]  # fmt: skip
        lines.append(f"| {config} | " + " | ".join(cells) + " |")
    lines += ["", "| config | " + " | ".join(f"{m} ttft_p99_s" for m in models) + " | cpu util / engine |"
              " max waiting | drain s |", "|---" * (len(models) + 4) + "|"]  # fmt: skip
    for config, scopes in summary.items():
        static = summary.get(baseline(config), {})
        per = [f"{scopes[m]['ttft_p99_s']:.3g}" + ratio(scopes[m]["ttft_p99_s"], static.get(m, {}).get("ttft_p99_s", 0))
               for m in models]  # fmt: skip
        o = scopes["overall"]
        lines.append(f"| {config} | " + " | ".join(per) +
                     f" | {o['cpu_utilisation']:.2f} | {o['max_waiting']:.0f} | {o['drain_s']:.1f} |")  # fmt: skip
    return "\n".join(lines)


def goals(name: str, summary: dict[str, dict[str, dict[str, float]]]) -> list[str]:
    """The issue's goals for the demand policy, each with its figure and whether it is met."""
    out = []
    for cfg in ("demand", "demand+tier"):
        if cfg not in summary or baseline(cfg) not in summary:
            continue
        ours, static = summary[cfg], summary[baseline(cfg)]
        models = [m for m in ours if m != "overall"]
        if name == "steady":
            worst = max(ours[m]["resizes_per_model_min"] for m in models)
            out.append(f"{name}/{cfg}: resizes/model/min {worst:.2f} (goal <= 2): {_met(worst <= 2)}")
            continue
        gain = static["overall"]["ttft_p99_s"] / ours["overall"]["ttft_p99_s"]
        tput = ours["overall"]["throughput_tok_s"] / static["overall"]["throughput_tok_s"]
        worst = max(ours[m]["ttft_p99_s"] / static[m]["ttft_p99_s"] for m in models)
        out.append(f"{name}/{cfg}: p99 TTFT {gain:.2f}x lower than static (goal >= 2.5): {_met(gain >= 2.5)}"
                   f"; throughput {tput:.2f}x (goal >= 0.98): {_met(tput >= 0.98)}"
                   f"; worst model p99 {worst:.2f}x static (goal <= 1.10): {_met(worst <= 1.1)}")  # fmt: skip
        free = summary.get(cfg.replace("demand", "free"))
        if free:
            ours_worst = max(ours[m]["ttft_p99_s"] for m in models)
            free_worst = max(free[m]["ttft_p99_s"] for m in models)
            out.append(f"{name}/{cfg}: worst model p99 {ours_worst:.3g} s vs free-for-all {free_worst:.3g} s: "
                       f"{_met(ours_worst < free_worst)}")  # fmt: skip
    return out


def _met(ok: bool) -> str:
    return "met" if ok else "MISSED"


def plots(name: str, results: dict[str, Any], out: Path) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    n = len(results)
    cols = 2 if n > 1 else 1
    fig, axes = plt.subplots((n + cols - 1) // cols, cols, figsize=(12, 2.6 * ((n + cols - 1) // cols)),
                             sharex=True, squeeze=False)  # fmt: skip
    colors = ("tab:blue", "tab:orange", "tab:green", "tab:red")
    for ax, (config, run) in zip(axes.flat, results.items(), strict=False):
        t = [s["t"] for s in run["samples"]]
        load = ax.twinx()
        for model, color in zip(run["final"], colors, strict=False):
            ax.plot(t, [s[model]["limit"] / MiB for s in run["samples"]], color=color, ls="--", lw=0.8)
            ax.plot(t, [s[model]["physical"] / MiB for s in run["samples"]], color=color, label=model)
            busy = [s[model]["running"] + s[model]["waiting"] for s in run["samples"]]
            load.fill_between(t, busy, color=color, alpha=0.10, step="post")
        ax.set_title(f"{config}: held (solid), limit (dashed), requests (shaded)", fontsize=9)
        ax.set_ylabel("KV MiB")
        ax.legend(loc="upper left", fontsize=7)
    for ax in list(axes.flat)[n:]:
        ax.axis("off")
    fig.tight_layout()
    mem = out / f"bench_colocation_{name}_memory.png"
    fig.savefig(mem, dpi=100)
    plt.close(fig)
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for config, run in results.items():
        ttft = sorted(o["ttft_s"] for o in run["outcomes"] if o["ok"])
        frac = [(i + 1) / len(ttft) for i in range(len(ttft))]
        ax.plot(ttft, frac, label=config, ls="--" if "+tier" in config else "-")
    ax.set_xscale("log")
    ax.set_xlabel("TTFT (s)")
    ax.set_ylabel("fraction of requests")
    ax.set_title(f"{name}: TTFT CDF")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    cdf = out / f"bench_colocation_{name}_ttft_cdf.png"
    fig.savefig(cdf, dpi=100)
    plt.close(fig)
    return [str(mem), str(cdf)]


def report(results: dict[str, dict[str, Any]], args: dict[str, Any], out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    summaries, pngs, checked = {}, [], []
    for name, runs in results.items():
        models = list(next(iter(runs.values()))["final"])
        summaries[name] = {c: {(s or "overall"): summarize(r, s) for s in [None, *models]} for c, r in runs.items()}
        pngs += plots(name, runs, out)
        print(tables(name, summaries[name]) + "\n")
        checked += goals(name, summaries[name])
    print("\n".join(checked))
    if "drift" in args:
        print(args["drift"])
    broken = [(w, c) for w, runs in results.items() for c, r in runs.items() if not all(r["integrity_ok"].values())]
    print(f"integrity after every run: {broken or 'ok'}")
    path = out / "bench_colocation.json"
    data = {"benchmark": "bench_colocation", "args": args, "summary": summaries, "goals": checked, "plots": pngs,
            "runs": results}  # fmt: skip
    path.write_text(json.dumps(data, indent=1))
    print(f"-> {path} {' '.join(pngs)}")
