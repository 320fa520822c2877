"""The colocation benchmark's report: per workload, one table with every configuration side by
side (overall, ratios to static of the same tier setting), one of each model's p99 TTFT, compute
saturation, the issue's goals checked, the JSON result, and two PNGs per workload (memory per
model over time with the load; TTFT CDF per configuration)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

MiB = 1 << 20
COLUMNS = ("ttft_p50_s", "ttft_p99_s", "latency_p99_s", "throughput_tok_s", "preemptions", "shrink_preemptions",
           "failed", "resizes_per_model_min", "mib_mapped")  # fmt: skip


def pct(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(len(s) * q))] if s else float("nan")


def summarize(runs: list[dict[str, Any]], model: str | None) -> dict[str, float]:
    """One configuration over its repeats (each a seed of the workload): percentiles over every
    repeat's requests -- one run's p99 of ~150 requests a model is decided by a burst's first
    seconds, and the same code met a goal in one run and missed it in the next --, rates over
    the summed wall time, counts per repeat on average, the deepest queue of any."""
    outs = [o for r in runs for o in r["outcomes"] if model is None or o["model"] == model]
    ok = [o for o in outs if o["ok"]]
    ttft, lat = [o["ttft_s"] for o in ok], [o["latency_s"] for o in ok]
    models = [m for m in runs[0]["final"] if model is None or m == model]
    wall, n = sum(r["wall_s"] for r in runs), len(runs)
    resizes = [z for r in runs for rnd in r["rounds"] for z in rnd["resizes"] if z["model"] in models]
    mapped = 0
    for r in runs:
        for prev, cur in zip(r["samples"], r["samples"][1:], strict=False):
            mapped += sum(max(0, cur[m]["physical"] - prev[m]["physical"]) for m in models)

    def per_run(counter: str) -> float:
        return float(sum(r["final"][m].get(counter, 0) for r in runs for m in models)) / n

    return {
        "requests": len(outs), "failed": len(outs) - len(ok), "repeats": n,
        "ttft_p50_s": pct(ttft, 0.5), "ttft_p99_s": pct(ttft, 0.99), "latency_p99_s": pct(lat, 0.99),
        "throughput_tok_s": sum(o["tokens"] for o in ok) / wall,
        "preemptions": sum(r["final"][m]["demand"]["preemptions"] for r in runs for m in models) / n,
        # of them, made to finish a shrink (preempt_after_s), not for lack of memory
        "shrink_preemptions": per_run("shrink_preemptions"),
        "resizes_per_model_min": len(resizes) / len(models) / (wall / 60),
        "mib_mapped": mapped / MiB / n,
        "tier_hits": sum((r["final"][m].get("offload") or {}).get("hits", 0) for r in runs for m in models) / n,
        "cpu_utilisation": sum(r["cpu_utilisation"][m] for r in runs for m in models) / len(models) / n,
        "max_waiting": max((s[m]["waiting"] for r in runs for s in r["samples"] for m in models), default=0),
        "drain_s": sum(r["wall_s"] - r["duration_s"] for r in runs) / n,
    }  # fmt: skip


def spread(runs: dict[str, list[dict[str, Any]]], config: str, model: str | None = None) -> tuple[float, float]:
    """The lowest and highest of the repeats' own p99 TTFT ratios to static (repeat k against
    static's repeat k: the same seed)."""
    each = [_ratio(r, b, model) for r, b in zip(runs[config], runs[baseline(config)], strict=False)]
    return min(each), max(each)


def _p99(run: dict[str, Any], model: str | None = None) -> float:
    """From the outcomes alone (a run's JSON of any stop has them); no request served: infinite."""
    p = pct([o["ttft_s"] for o in run["outcomes"] if o["ok"] and model in (None, o["model"])], 0.99)
    return p if p == p else math.inf


def _ratio(run: dict[str, Any], static: dict[str, Any], model: str | None = None) -> float:
    base = _p99(static, model)
    return _p99(run, model) / base if 0 < base < math.inf else math.nan  # nan: no static figure to weigh


def baseline(config: str) -> str:
    return "static+tier" if config.endswith("+tier") else "static"


def ratio(x: float, base: float) -> str:
    return f" ({x / base:.2f}x)" if base and base == base and x == x else ""


def between(scope: dict[str, float]) -> str:
    """The repeats' own p99 ratios to static, lowest to highest ("" for static or one repeat)."""
    lo, hi = scope.get("p99_ratio_lo"), scope.get("p99_ratio_hi")
    return f"{lo:.2f}-{hi:.2f}x" if lo is not None and hi is not None and scope["repeats"] > 1 else ""


def tables(name: str, summary: dict[str, dict[str, dict[str, float]]]) -> str:
    models = [s for s in next(iter(summary.values())) if s != "overall"]
    head = "| config | " + " | ".join(COLUMNS) + " | ttft_p99 per repeat |"
    lines = [f"#### {name}", "", head, "|---" * (len(COLUMNS) + 2) + "|"]
    for config, scopes in summary.items():
        base = summary.get(baseline(config), {}).get("overall", {})
        cells = [f"{scopes['overall'][k]:.3g}" + (ratio(scopes["overall"][k], base.get(k, 0)) if k in COLUMNS[:4]
                 else "") for k in COLUMNS]  # fmt: skip
        lines.append(f"| {config} | " + " | ".join(cells) + f" | {between(scopes['overall'])} |")
    lines += ["", "| config | " + " | ".join(f"{m} ttft_p99_s" for m in models) + " | cpu util / engine |"
              " max waiting | drain s |", "|---" * (len(models) + 4) + "|"]  # fmt: skip
    for config, scopes in summary.items():
        static = summary.get(baseline(config), {})
        per = [f"{scopes[m]['ttft_p99_s']:.3g}" + ratio(scopes[m]["ttft_p99_s"], static.get(m, {}).get("ttft_p99_s", 0))
               + (f" [{between(scopes[m])}]" if between(scopes[m]) else "") for m in models]  # fmt: skip
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
        slowest = max(models, key=lambda m: ours[m]["ttft_p99_s"] / static[m]["ttft_p99_s"])
        times = ours[slowest]["ttft_p99_s"] / static[slowest]["ttft_p99_s"]
        each = f" (repeats: {between(ours['overall'])} of static)" if between(ours["overall"]) else ""
        out.append(f"{name}/{cfg}: p99 TTFT {gain:.2f}x lower than static{each} (goal >= 2.5): {_met(gain >= 2.5)}"
                   f"; throughput {tput:.2f}x (goal >= 0.98): {_met(tput >= 0.98)}"
                   f"; worst model {slowest} p99 {times:.2f}x static (goal <= 1.10): {_met(times <= 1.1)}")  # fmt: skip
        free = summary.get(cfg.replace("demand", "free"))
        if free:
            ours_worst = max(ours[m]["ttft_p99_s"] for m in models)
            free_worst = max(free[m]["ttft_p99_s"] for m in models)
            out.append(f"{name}/{cfg}: worst model p99 {ours_worst:.3g} s vs free-for-all {free_worst:.3g} s: "
                       f"{_met(ours_worst < free_worst)}")  # fmt: skip
    return out


RIVALS = ("free", "proportional")  #: what the demand policy is weighed against, seed by seed


def head_to_head(name: str, runs: dict[str, list[dict[str, Any]]]) -> list[str]:
    """Seed by seed, the demand policy against each rival of the same tier setting: in how many
    seeds its p99 TTFT was the lower, and its worst model's (each model's p99 against static's on
    the same seed). The pooled p99 of two seeds is a handful of requests: from stop 47 to 49 the
    row's leader swapped from run to run, and a ranking that holds seed by seed says more."""
    out = []
    for cfg in ("demand", "demand+tier"):
        base = baseline(cfg)
        if name == "steady" or cfg not in runs or base not in runs:
            continue
        for rival in (cfg.replace("demand", r) for r in RIVALS):
            if rival not in runs:
                continue
            seeds = list(zip(runs[cfg], runs[rival], runs[base], strict=False))
            p99 = [tuple(_ratio(r, s) for r in (ours, theirs)) for ours, theirs, s in seeds]
            worst = [tuple(_worst(r, s) for r in (ours, theirs)) for ours, theirs, s in seeds]
            out.append(f"{name}/{cfg} vs {rival}, seed by seed: p99 TTFT the lower in {_wins(p99)}; "
                       f"worst model the lower in {_wins(worst)} (x static, ours vs theirs)")  # fmt: skip
    return out


def _worst(run: dict[str, Any], static: dict[str, Any]) -> float:
    """The highest ratio of any model with a static figure (nan if none has one)."""
    return max((r for m in run["final"] if (r := _ratio(run, static, m)) == r), default=math.nan)


def _wins(pairs: list[tuple[float, ...]]) -> str:
    """How often ours was the lower, of the seeds with a static figure (a tie is no win)."""
    weighed = [(ours, theirs) for ours, theirs in pairs if ours == ours and theirs == theirs]
    won = sum(ours < theirs for ours, theirs in weighed)
    each = ", ".join(f"{ours:.2f} vs {theirs:.2f}" for ours, theirs in pairs)
    return f"{won} of {len(weighed)} ({each})"


def _met(ok: bool) -> str:
    return "met" if ok else "MISSED"


def plots(name: str, results: dict[str, list[dict[str, Any]]], out: Path) -> list[str]:
    """Memory per model over time (the first repeat: a trace, not an average) and the TTFT CDF
    (every repeat's requests)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    n = len(results)
    cols = 2 if n > 1 else 1
    fig, axes = plt.subplots((n + cols - 1) // cols, cols, figsize=(12, 2.6 * ((n + cols - 1) // cols)),
                             sharex=True, squeeze=False)  # fmt: skip
    colors = ("tab:blue", "tab:orange", "tab:green", "tab:red")
    for ax, (config, repeats) in zip(axes.flat, results.items(), strict=False):
        run = repeats[0]
        t = [s["t"] for s in run["samples"]]
        load = ax.twinx()
        for model, color in zip(run["final"], colors, strict=False):
            ax.plot(t, [s[model]["limit"] / MiB for s in run["samples"]], color=color, ls="--", lw=0.8)
            ax.plot(t, [s[model]["physical"] / MiB for s in run["samples"]], color=color, label=model)
            busy = [s[model]["running"] + s[model]["waiting"] for s in run["samples"]]
            load.fill_between(t, busy, color=color, alpha=0.10, step="post")
        ax.set_title(
            f"{config} (seed 1 of {len(repeats)}): held (solid), limit (dashed), requests (shaded)", fontsize=9
        )
        ax.set_ylabel("KV MiB")
        ax.legend(loc="upper left", fontsize=7)
    for ax in list(axes.flat)[n:]:
        ax.axis("off")
    fig.tight_layout()
    mem = out / f"bench_colocation_{name}_memory.png"
    fig.savefig(mem, dpi=100)
    plt.close(fig)
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for config, repeats in results.items():
        ttft = sorted(o["ttft_s"] for run in repeats for o in run["outcomes"] if o["ok"])
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


def summaries_of(runs: dict[str, list[dict[str, Any]]]) -> dict[str, dict[str, dict[str, float]]]:
    """Every configuration of one workload, overall and per model, pooled over its repeats, with
    the repeats' own p99 ratios to static beside (``spread``)."""
    models = list(next(iter(runs.values()))[0]["final"])
    out: dict[str, dict[str, dict[str, float]]] = {}
    for config, repeats in runs.items():
        out[config] = {}
        for scope in [None, *models]:
            s = summarize(repeats, scope)
            if baseline(config) in runs:
                s["p99_ratio_lo"], s["p99_ratio_hi"] = spread(runs, config, scope)
            out[config][scope or "overall"] = s
    return out


def machine_lines(args: dict[str, Any]) -> list[str]:
    """How fast the machine was (the calibration), whether it held still (the drift) and whether
    the peak left its cores headroom (the saturation); a run before stop 38 has no calibration
    line, one before stop 39 no saturation line."""
    return [args[line] for line in ("calibration", "drift", "saturation") if line in args]


LATE_S = 2.5  #: a round this long (the interval is 1 s, rounds took <= 0.9 s) read a server that hardly answered


def lateness_line(results: dict[str, dict[str, list[dict[str, Any]]]]) -> str:
    """One line for the report: each workload's slowest operator round. An engine loaded past its
    cores answers its admin API late; the operator's round (which reads every pool in turn) then
    stalls, and every configuration it steers acts on a picture seconds old (stop 46's longtail
    rerun: a 5.3-s round, one server's admin API past the client's 5-s timeout, while neither the
    drift nor the saturation line flagged it)."""
    rounds = {w: [r["seconds"] for rs in runs.values() for run in rs for r in run["rounds"]]
              for w, runs in results.items()}  # fmt: skip
    if not any(rounds.values()):
        return "slowest operator round: no operator rounds (no policy configuration ran)"
    cells = ", ".join(f"{w} {max(s, default=0):.1f} s ({sum(x > LATE_S for x in s)} of {len(s)} over {LATE_S} s)"
                      for w, s in rounds.items())  # fmt: skip
    flagged = [w for w, s in rounds.items() if max(s, default=0) > LATE_S]
    verdict = (f"LATE in {', '.join(flagged)}: the operator read its servers seconds behind"
               if flagged else f"every round within {LATE_S} s")  # fmt: skip
    return f"slowest operator round: {cells} -- {verdict}"


def report(results: dict[str, dict[str, list[dict[str, Any]]]], args: dict[str, Any], out: Path) -> None:
    """``results``: workload -> configuration -> its repeats' runs."""
    out.mkdir(parents=True, exist_ok=True)
    summaries, pngs, checked, rivals = {}, [], [], []
    for name, runs in results.items():
        summaries[name] = summaries_of(runs)
        pngs += plots(name, runs, out)
        print(tables(name, summaries[name]) + "\n")
        checked += goals(name, summaries[name])
        rivals += head_to_head(name, runs)
    print("\n".join(checked + rivals))
    late = lateness_line(results)
    print(*machine_lines(args), late, sep="\n")
    broken = [(w, c, k) for w, runs in results.items() for c, rs in runs.items() for k, r in enumerate(rs)
              if not all(r["integrity_ok"].values())]  # fmt: skip
    print(f"integrity after every run: {broken or 'ok'}")
    path = out / "bench_colocation.json"
    data = {"benchmark": "bench_colocation", "args": args, "summary": summaries, "goals": checked,
            "head_to_head": rivals, "lateness": late, "plots": pngs, "runs": results}  # fmt: skip
    path.write_text(json.dumps(data, indent=1))
    print(f"-> {path} {' '.join(pngs)}")
