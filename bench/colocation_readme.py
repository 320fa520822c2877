"""The README's colocation table from a run's JSON (``python -m bench.colocation_readme
[results/bench_colocation.json]``): one row per workload and configuration, static's figures in
seconds and every other configuration's as ratios to static of the same tier setting, so the
table of record is printed from the run, never typed from it."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from bench.colocation_report import baseline, between, head_to_head, machine_lines

HEAD = ("| workload | config | TTFT p50 | TTFT p99 | p99 per seed | e2e p99 | tok/s | preempt (for shrinks) | failed "
        "| resizes/model/min | MiB mapped | worst model p99 vs static |")  # fmt: skip


def seconds(x: float) -> str:
    return f"{x * 1000:.0f} ms" if x < 1 else f"{x:.2f} s"


def row(workload: str, config: str, scopes: dict[str, dict[str, float]], static: dict[str, dict[str, float]]) -> str:
    o, base = scopes["overall"], static["overall"]
    models = [m for m in scopes if m != "overall"]
    worst = max(scopes[m]["ttft_p99_s"] / static[m]["ttft_p99_s"] for m in models)
    if config == baseline(config):
        timing = [seconds(o[k]) for k in ("ttft_p50_s", "ttft_p99_s")] + ["", seconds(o["latency_p99_s"])]
        tput = f"{o['throughput_tok_s']:.0f}"
    else:
        timing = [f"{o[k] / base[k]:.2f}x" for k in ("ttft_p50_s", "ttft_p99_s")]
        timing += [between(o), f"{o['latency_p99_s'] / base['latency_p99_s']:.2f}x"]
        tput = f"{o['throughput_tok_s'] / base['throughput_tok_s']:.2f}x"
    cells = [workload, config, *timing, tput, f"{o['preemptions']:.0f} ({o['shrink_preemptions']:.0f})",
             f"{o['failed']:.0f}", f"{o['resizes_per_model_min']:.1f}", f"{o['mib_mapped']:.0f}",
             f"{worst:.2f}x"]  # fmt: skip
    return "| " + " | ".join(cells) + " |"


def table(data: dict[str, Any]) -> str:
    lines = [HEAD, "|---" * HEAD.count(" | ") + "|---|"]
    for workload, configs in data["summary"].items():
        for config, scopes in configs.items():
            lines.append(row(workload, config, scopes, configs[baseline(config)]))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    path = Path(args[0]) if args else Path("results/bench_colocation.json")
    data = json.loads(path.read_text())
    print(table(data))
    print()
    print("\n".join(data["goals"]))
    # from the runs, not the JSON's own list: a run before stop 50 has none
    print(*(line for name, runs in data["runs"].items() for line in head_to_head(name, runs)), sep="\n")
    print(*machine_lines(data["args"]), sep="\n")


if __name__ == "__main__":
    main()
