"""Our engine (KV cache in a kvpool) vs stock vLLM: same tiny model, same workload, same run.

Only one engine is up at a time (an idle vLLM worker keeps polling its queue -- about a third of
a core here -- and on two cores that would tax whichever engine runs beside it); the engines
take turns in alternating order (A B, B A, ...), and in each turn both get the same workload
seeds, so each round of ours pairs with one of stock's. Prints every engine setting that differs
(from each engine's own ``VllmConfig``), then per metric the median of the per-pair ratios, their
range and a bootstrap 95% interval (goal: within 3%); writes results/bench_engine.json.
Run: ``python -m bench.bench_engine`` (``--model smollm2`` for the real default model).
"""

from __future__ import annotations

import argparse
import random
import time
from typing import Any

from bench.common import (
    config_differences,
    paired_ratios,
    print_config_differences,
    ttft_percentiles,
)
from bench.models import resolve_model

MiB = 1 << 20


def workload(n: int, prompt_tokens: int, seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(10, 2000) for _ in range(prompt_tokens)] for _ in range(n)]


def one_round(runner: Any, prompts: list[list[int]], max_tokens: int) -> dict[str, float]:
    from vllm import SamplingParams

    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    start = time.perf_counter()
    out = runner.generate(prompts, params)
    wall = time.perf_counter() - start
    return {"tokens_per_s": sum(len(c.token_ids) for c in out) / wall, **ttft_percentiles([c.ttft_s for c in out])}


def config_json(vllm_config: Any) -> dict[str, Any]:
    """An engine's ``VllmConfig`` as JSON values (as vLLM's ``/server_info`` renders it)."""
    import pydantic
    from vllm.config import VllmConfig

    return dict(pydantic.TypeAdapter(VllmConfig).dump_python(vllm_config, mode="json", fallback=str))


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--requests", type=int, default=64)
    p.add_argument("--prompt-tokens", type=int, default=256)
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--rounds", type=int, default=1, help="measured rounds per turn")
    p.add_argument("--turns", type=int, default=6, help="times each engine is started (order alternates)")
    p.add_argument("--model", default="tiny", help="tiny (default), smollm2, or a model folder")
    p.add_argument("--trim", action="store_true", help="trim the pool before each round (measures regrowth)")
    args = p.parse_args(argv)
    from kvpool.vllm.launch.args import PoolEngineConfig
    from kvpool.vllm.launch.runner import EngineRunner

    model = resolve_model(args.model)
    makers = {
        "stock": lambda: EngineRunner(model, None, max_model_len=2048, kv_cache_memory_bytes=512 * MiB),
        "kvpool": lambda: EngineRunner(
            model, PoolEngineConfig(model=model, limit_bytes=512 * MiB, virtual_bytes=2048 * MiB), max_model_len=2048
        ),
    }
    rounds: dict[str, list[dict[str, float]]] = {k: [] for k in makers}
    rss: dict[str, list[int]] = {k: [] for k in makers}  # the worker's resident bytes after the rounds
    configs: dict[str, dict[str, Any]] = {}
    for turn in range(args.turns):
        for name in list(makers) if turn % 2 == 0 else list(makers)[::-1]:
            runner = makers[name]()
            try:
                configs.setdefault(name, config_json(runner.engine.vllm_config))
                # warm-up, not counted: a round of the measured shape, so that both engines start the
                # rounds in their steady state (ours has mapped the pages a round needs; --trim
                # measures the growth instead)
                one_round(runner, workload(args.requests, args.prompt_tokens), args.max_tokens)
                for i in range(args.rounds):
                    if args.trim and name == "kvpool":
                        runner.trim()
                    prompts = workload(args.requests, args.prompt_tokens, seed=1 + turn * args.rounds + i)
                    rounds[name].append(one_round(runner, prompts, args.max_tokens))
                rss[name].append(runner.worker_rss())
            finally:
                runner.close()
        if turn == 0:
            print_config_differences(config_differences(configs))
    paired_ratios("bench_engine", rounds, "stock", vars(args), worker_rss_bytes=rss,
                  config_differences=config_differences(configs))  # fmt: skip
    print("worker RSS after the rounds (MiB): " + "  ".join(f"{k} {max(v) >> 20}" for k, v in rss.items()))


if __name__ == "__main__":
    main()
