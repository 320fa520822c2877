"""Where each server spends its CPU under the benchmark's load: py-spy over every process.

For each configuration (``bench.servers.VARIANTS``) the server starts alone, vLLM's benchmark
client loads it, and ``py-spy record --subprocesses --nonblocking`` samples the API process, the
engine core and the worker for ``--seconds`` (active threads only: a sample is CPU in use or a
thread about to run). Per process and configuration it prints the samples, the share of them
inside our code (any frame in ``kvpool/`` or ``kvpool_server/``) and the functions that use the
most CPU themselves; writes results/profile_server.json and the raw stacks (flamegraph input)
beside the logs. Run: ``python -m bench.profile_server --configs stock connector kvpool``.
"""

from __future__ import annotations

import argparse
import collections
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from bench.bench_server import serve_round
from bench.common import write_result
from bench.models import resolve_model
from bench.servers import VARIANTS, launch

#: where py-spy's process entries start; a command line may itself hold quotes and ";" (our
#: connector's JSON flag), so an entry ends at the first '";' after its start
PROCESS = re.compile(r'(?:^|;)process \d+:"')
OURS = ("kvpool/", "kvpool_server/")


def role(cmdline: str) -> str:
    """The vLLM process a command line belongs to (vLLM names its processes with setproctitle)."""
    for tag in ("EngineCore", "Worker"):
        if tag in cmdline:
            return tag
    return "APIServer" if "api_server" in cmdline or "kvpool_server" in cmdline else cmdline[:80]


def summarise(raw: Path, top: int) -> dict[str, dict[str, Any]]:
    """Samples per process role from py-spy's raw (collapsed) stacks: total, share in our code,
    the functions with the most self samples."""
    total: collections.Counter[str] = collections.Counter()
    ours: collections.Counter[str] = collections.Counter()
    leaf: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        starts = [m.end() for m in PROCESS.finditer(stack)]
        cmdline, _, frames = stack[starts[-1] :].partition('";') if starts else ("?", "", stack)
        who = role(cmdline)
        code = [f for f in frames.split(";") if f and not f.startswith("thread ")]
        n = int(count)
        total[who] += n
        if any(o in f for f in code for o in OURS):
            ours[who] += n
        leaf[who][code[-1] if code else "(no Python frame)"] += n
    return {
        who: {"samples": n, "ours_share": ours[who] / n, "top_self": leaf[who].most_common(top)}
        for who, n in total.most_common()
    }


def py_spy() -> str:
    """py-spy from this interpreter's environment (dev.lock), else from PATH."""
    beside = Path(sys.executable).parent / "py-spy"
    found = str(beside) if beside.exists() else shutil.which("py-spy")
    if found is None:
        raise SystemExit("py-spy is not installed: run `make install` (it is in requirements/dev.lock)")
    return found


def profile(name: str, model: str, args: argparse.Namespace, tmp: Path) -> dict[str, dict[str, Any]]:
    server = launch(name, model, "bench", tmp / f"{name}.log")
    raw = tmp / f"{name}.raw.txt"
    try:
        serve_round(server, model, args, seed=0, prompts=args.concurrency)  # warm-up
        spy = subprocess.Popen([py_spy(), "record", "--pid", str(server.proc.pid),
                                "--subprocesses", "--nonblocking", "--format", "raw", "--rate", "100",
                                "--duration", str(args.seconds), "--output", str(raw)],
                               stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)  # fmt: skip
        seed = 1
        while spy.poll() is None:  # keep the load on for the whole record
            serve_round(server, model, args, seed=seed, prompts=args.prompts)
            seed += 1
        spy.wait(timeout=60)
    finally:
        server.stop()
    return summarise(raw, args.top)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="tiny", help="tiny (default), smollm2, or a model folder")
    p.add_argument("--configs", nargs="+", default=["stock", "connector", "kvpool"], choices=list(VARIANTS))
    p.add_argument("--seconds", type=int, default=20, help="sampling time per configuration")
    p.add_argument("--prompts", type=int, default=64, help="requests per client run (runs repeat)")
    p.add_argument("--concurrency", type=int, default=32)
    p.add_argument("--input-len", type=int, default=256)
    p.add_argument("--output-len", type=int, default=64)
    p.add_argument("--top", type=int, default=8, help="functions listed per process")
    args = p.parse_args(argv)
    model = resolve_model(args.model)
    tmp = Path(tempfile.mkdtemp(prefix="kvpool-profile-"))
    out = {name: profile(name, model, args, tmp) for name in args.configs}
    for name, procs in out.items():
        for who, s in procs.items():
            print(f"{name:>14} {who:>10}: {s['samples']:6d} samples, {100 * s['ours_share']:5.1f}% in kvpool code")
            for fn, n in s["top_self"]:
                print(f"{'':>27}{100 * n / s['samples']:5.1f}%  {fn[:110]}")
    print(f"raw stacks (flamegraph input) in {tmp}")
    write_result("profile_server", {"args": vars(args), "processes": out})


if __name__ == "__main__":
    main()
