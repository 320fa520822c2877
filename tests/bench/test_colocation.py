"""The colocation benchmark's own logic, without servers: the workloads are seeded and follow their
rate curves (rates relative to the calibration), the report's figures and goal checks come from
the outcomes they are given."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from kvpool_operator.balance import PodRound
from kvpool_operator.demand import plan_demand
from kvpool_operator.policy import GroupPolicy, ModelBudget, Observation

from bench.bench_colocation import PARTIAL, PEAK, RESULTS, parse, workloads
from bench.colocation_calibrate import Capacity
from bench.colocation_configs import Config, Setup, configs, core_of, group_spec, seen, server_cmd
from bench.colocation_report import goals, head_to_head, summaries_of, summarize, tables
from bench.colocation_workload import Shape, bursts, longtail, schedule

MiB = 1 << 20


def arrivals(reqs: list[Any], model: str, start: float, end: float) -> int:
    return sum(1 for r in reqs if r.model == model and start <= r.at_s < end)


def test_the_schedule_is_seeded_and_follows_the_bursts() -> None:
    work = bursts(unit=10.0, hot=2.0, cold=0.1, phase_s=30.0)
    reqs = schedule(work, Shape(), seed=3)
    assert reqs == schedule(work, Shape(), seed=3)
    assert reqs != schedule(work, Shape(), seed=4)
    assert arrivals(reqs, "a", 0, 30) == pytest.approx(600, rel=0.15)  # 20/s for 30 s
    assert arrivals(reqs, "b", 0, 30) == pytest.approx(30, rel=0.5)  # 1/s
    assert arrivals(reqs, "b", 30, 60) == pytest.approx(600, rel=0.15)  # the turn passes to b
    shape = Shape()
    assert all(shape.prompt_tokens[0] <= len(r.prompt) <= shape.prompt_tokens[1] for r in reqs)


def test_the_long_tail_peaks_are_staggered_and_ranked_by_popularity() -> None:
    work = longtail(unit=10.0, hot=2.0, cold=0.1, phase_s=20.0)
    reqs = schedule(work, Shape(), seed=0)
    peaks = {m: max(range(4), key=lambda p: arrivals(reqs, m, p * 20, (p + 1) * 20)) for m in "abc"}
    assert peaks["a"] < peaks["b"] < peaks["c"]
    totals = [sum(r.model == m for r in reqs) for m in "abc"]
    assert totals[0] > totals[1] > totals[2]


def test_rates_come_from_the_calibration() -> None:
    cap = Capacity(shares_rps={2: 4.0, 3: 3.0}, full_rps=8.0, request_bytes=MiB, clients=8)
    burst, tail, flat = workloads(["bursts", "longtail", "steady"], cap, phase_s=10.0)
    hot = max(p.rate for p in burst.curves["a"])
    assert cap.share_rps(2) < hot < cap.full_rps  # above what the share serves, below the whole budget's
    tail_hot = max(p.rate for p in tail.curves["a"])
    assert cap.share_rps(3) < tail_hot < cap.full_rps  # three models: relative to a third of the budget
    assert tail_hot == pytest.approx(3.0 * (1 + PEAK * (8.0 / 3.0 - 1)))
    assert flat.curves["a"][0].rate < cap.share_rps(2)  # steady: within what the share serves


def test_the_busiest_model_keeps_a_core_of_its_own() -> None:
    assert [core_of(i, cores=2) for i in range(4)] == [0, 1, 1, 1]
    assert [core_of(i, cores=4) for i in range(5)] == [0, 1, 2, 3, 1]
    assert [core_of(i, cores=1) for i in range(2)] == [0, 0]


def test_only_the_free_for_all_gets_the_whole_budget_and_the_ledger() -> None:
    setup = Setup("/m", "host", 16 * MiB, 32 * MiB, 1.0, 4.0)
    from pathlib import Path

    for cfg in configs(["static", "free", "demand"]):
        cmd = server_cmd(setup, cfg, "a", (8000, 8100), 2, Path("/tmp/x"))
        limit = int(cmd[cmd.index("--limit-bytes") + 1])
        assert limit == (16 * MiB if cfg.policy == "free" else 8 * MiB)
        assert ("--ledger-bytes" in cmd) == (cfg.policy == "free")
        assert ("--offload-bytes" in cmd) == cfg.tier
        assert cmd[cmd.index("--admin-port") + 1] == "8100"  # the Balancer's endpoint, apart from the traffic's
    assert Config("demand", True).name == "demand+tier"


def test_the_drain_variant_runs_the_demand_policy_on_servers_that_never_preempt() -> None:
    from pathlib import Path

    setup = Setup("/m", "host", 16 * MiB, 32 * MiB, 1.0, 4.0)
    drain, demand = configs(["demand-drain", "demand"])[:2]
    assert (drain.policy, drain.name, demand.name) == ("demand", "demand-drain", "demand")
    cmd = server_cmd(setup, drain, "a", (8000, 8100), 2, Path("/tmp/x"))
    assert cmd[cmd.index("--preempt-after-s") + 1] == "null"
    assert "--preempt-after-s" not in server_cmd(setup, demand, "a", (8000, 8100), 2, Path("/tmp/x"))
    assert parse(["--policies", "static,demand-drain"]).out == PARTIAL


def test_a_cadence_variant_runs_its_policy_at_its_own_interval_and_dwell() -> None:
    setup = Setup("/m", "host", 16 * MiB, 32 * MiB, 1.0, 8.0)
    slow, fast = configs(["demand-drain@10:30", "demand"])[:2]
    assert (slow.name, slow.policy, slow.preempt, slow.cadence) == ("demand-drain@10:30", "demand", False, (10.0, 30.0))
    assert configs(["demand@2:16"])[1].name == "demand@2:16+tier"
    for cfg, interval, dwell_rounds in ((slow, 10.0, 3), (fast, 1.0, 8)):
        group = group_spec(setup, cfg, ("a", "b"))
        assert (group.interval_s, group.policy.dwell_rounds) == (interval, dwell_rounds)
    assert parse(["--policies", "static,demand,demand@10:30"]).out == PARTIAL


def fake_run(ttfts: dict[str, list[float]], resizes: int = 0) -> dict[str, Any]:
    outcomes = [{"model": m, "ok": True, "ttft_s": t, "latency_s": t + 1, "tokens": 10} for m, ts in ttfts.items()
                for t in ts]  # fmt: skip
    pool = {"limit": 8 * MiB, "mapped": 0, "physical": 4 * MiB, "running": 0, "waiting": 2}
    return {
        "outcomes": outcomes, "wall_s": 60.0, "duration_s": 50.0,
        "final": {m: {"demand": {"preemptions": 1}} for m in ttfts},
        "rounds": [{"seconds": 0.3, "resizes": [{"model": "a"}] * resizes}],
        "samples": [{"t": 0, **{m: pool for m in ttfts}}],
        "cpu_utilisation": dict.fromkeys(ttfts, 0.5),
    }  # fmt: skip


def test_the_report_checks_the_goals_against_static() -> None:
    runs = {"static": fake_run({"a": [1.0] * 100, "b": [1.0] * 100}),
            "demand": fake_run({"a": [0.3] * 100, "b": [1.05] * 100}, resizes=3),
            "free": fake_run({"a": [0.1] * 100, "b": [5.0] * 100})}  # fmt: skip
    summary = {c: {(s or "overall"): summarize([r], s) for s in [None, "a", "b"]} for c, r in runs.items()}
    assert summary["demand"]["a"]["resizes_per_model_min"] == 3.0
    assert summary["static"]["overall"]["drain_s"] == 10.0
    checked = goals("bursts", summary)
    assert "0.95x lower than static (goal >= 2.5): MISSED" in checked[0]  # the worst request sets p99
    assert "worst model b p99 1.05x static (goal <= 1.10): met" in checked[0]
    assert checked[1].endswith("met")  # b: 1.05 s under demand vs 5 s under the free-for-all


def test_only_the_full_run_writes_the_results_of_record() -> None:
    assert parse([]).out == RESULTS
    for subset in (["--tier", "off"], ["--workloads", "bursts"], ["--policies", "static,demand"]):
        assert parse(subset).out == PARTIAL, subset
    assert str(parse(["--tier", "off", "--out", "/tmp/mine"]).out) == "/tmp/mine"


def test_an_unknown_policy_is_refused_by_its_flag(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        parse(["--policies", "static,greedy"])
    assert "--policies: 'greedy': 'greedy' is not among" in capsys.readouterr().err
    for bad, says in (("static@2:16", "is not among ['proportional', 'demand']"), ("demand@10", "INTERVAL:DWELL"),
                      ("demand@0.5:8", "at least 1 s"), ("free-drain", "is not among")):  # fmt: skip
        with pytest.raises(SystemExit):
            parse(["--policies", f"static,{bad}"])
        assert says in capsys.readouterr().err, bad


def test_a_machine_whose_speed_moved_within_the_run_is_flagged() -> None:
    from bench.colocation_calibrate import Capacity, drift_line

    caps = {"bursts": Capacity({2: 5.0}, 8.0, 1 << 20, 22), "longtail": Capacity({3: 4.0}, 7.0, 1 << 20, 22)}
    steady = drift_line(caps, {"bursts": 7.5, "longtail": 7.7})
    assert "bursts 8.00 -> 7.50 (-6%), longtail 7.00 -> 7.70 (+10%)" in steady  # each against its own
    assert steady.endswith("steady within 20%")
    moved = drift_line(caps, {"bursts": 7.5, "longtail": 5.5})
    assert moved.endswith("MOVED more than 20% within longtail: its rates no longer fit the machine")


def test_a_peak_that_leaves_the_cores_no_headroom_is_flagged_as_saturated() -> None:
    from bench.colocation_calibrate import saturation_line

    fits = saturation_line({"bursts": 5.6, "longtail": 4.0}, {"bursts": 8.0, "longtail": 6.0})
    assert "bursts 5.60 of 8.00 (70%), longtail 4.00 of 6.00 (67%)" in fits
    assert fits.endswith("memory, not the cores, decides")
    slowed = saturation_line({"bursts": 5.6, "longtail": 4.0}, {"bursts": 6.2, "longtail": 6.0})
    assert "SATURATED in bursts:" in slowed  # 90% of what the whole budget served after it


def test_a_workload_whose_operator_round_stalled_is_flagged_late() -> None:
    from bench.colocation_report import lateness_line

    def runs(*seconds: float) -> dict[str, list[dict[str, Any]]]:
        return {"static": [{"rounds": []}], "demand": [{"rounds": [{"seconds": s} for s in seconds]}]}

    prompt = lateness_line({"bursts": runs(0.4, 0.9), "longtail": runs(0.5)})
    assert "bursts 0.9 s (0 of 2 over 2.5 s), longtail 0.5 s (0 of 1 over 2.5 s)" in prompt
    assert prompt.endswith("every round within 2.5 s")
    late = lateness_line({"bursts": runs(0.4), "longtail": runs(0.5, 5.3, 2.6)})
    assert "longtail 5.3 s (2 of 3 over 2.5 s)" in late
    assert "LATE in longtail:" in late
    assert "bursts" not in late.split("--")[1]


def test_the_peak_of_a_workload_is_its_busiest_piece() -> None:
    work = bursts(2.0, hot=1.5, cold=0.1, phase_s=10.0)
    assert work.peak_rps == pytest.approx(3.0)


def test_repeats_are_pooled_and_their_own_ratios_shown_beside() -> None:
    # static: p99 2 s in the first repeat, 4 s in the second; demand halves the first, equals the second
    static = [fake_run({"a": [1.0] * 99 + [2.0], "b": [1.0] * 100}),
              fake_run({"a": [1.0] * 99 + [4.0], "b": [1.0] * 100})]  # fmt: skip
    demand = [fake_run({"a": [1.0] * 99 + [1.0], "b": [1.0] * 100}, resizes=3),
              fake_run({"a": [1.0] * 99 + [4.0], "b": [1.0] * 100}, resizes=3)]  # fmt: skip
    summary = summaries_of({"static": static, "demand": demand})
    a = summary["demand"]["a"]
    assert (a["requests"], a["repeats"]) == (200, 2)
    # pooled: the 99th percentile of all 200 requests (the second highest), not the mean of two p99s
    assert (summary["static"]["a"]["ttft_p99_s"], a["ttft_p99_s"]) == (2.0, 1.0)
    assert (a["p99_ratio_lo"], a["p99_ratio_hi"]) == (0.5, 1.0)  # repeat k against static's repeat k
    assert a["resizes_per_model_min"] == 3.0  # 6 resizes over two minutes of wall time
    assert a["preemptions"] == 1.0  # per repeat, on average
    text = tables("bursts", summary)
    assert "0.50-1.00x" in text
    assert "p99 TTFT 1.00x lower than static (repeats: 1.00-1.00x of static)" in goals("bursts", summary)[0]


def test_the_demand_policy_is_weighed_against_each_rival_seed_by_seed() -> None:
    static = [fake_run({"a": [1.0] * 100, "b": [2.0] * 100}) for _ in range(2)]
    # seed 0: demand's p99 the lower (1.0 s of static's 2.0 against 1.8), its worst model (a, 0.9x)
    # tied with proportional's (b, 1.8 of 2.0); seed 1: proportional's both
    demand = [fake_run({"a": [0.9] * 100, "b": [1.0] * 100}), fake_run({"a": [1.0] * 100, "b": [3.0] * 100})]
    proportional = [fake_run({"a": [0.5] * 100, "b": [1.8] * 100}), fake_run({"a": [0.6] * 100, "b": [1.0] * 100})]
    runs = {"static": static, "demand": demand, "proportional": proportional}
    assert head_to_head("bursts", runs) == [
        "bursts/demand vs proportional, seed by seed: p99 TTFT the lower in 1 of 2 (0.50 vs 0.90, 1.50 vs 0.50); "
        "worst model the lower in 0 of 2 (0.90 vs 0.90, 1.50 vs 0.60) (x static, ours vs theirs)"
    ]  # no free-for-all ran: no line for it; a tie is no win
    assert head_to_head("steady", runs) == []  # steady's goal is flapping, not latency


def test_repeats_below_one_are_refused_by_their_flag(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        parse(["--repeats", "0"])
    assert "--repeats: 0 must be at least 1" in capsys.readouterr().err
    assert parse(["--repeats", "1"]).out == PARTIAL  # not the run of record


@pytest.mark.parametrize("peak", ["0", "1", "1.5", "-0.2"])
def test_a_peak_outside_the_share_to_whole_range_is_refused_by_its_flag(
    peak: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit):
        parse(["--peak", peak])
    assert f"--peak: {float(peak)} must be between 0 and 1" in capsys.readouterr().err
    assert parse(["--peak", "0.6"]).out == PARTIAL  # another load than the run of record's


def test_configurations_alternate_their_order_from_one_repeat_to_the_next() -> None:
    from bench.bench_colocation import alternate

    cfgs = configs(["static", "demand"])
    assert alternate(cfgs, 0) == cfgs
    assert alternate(cfgs, 1) == cfgs[::-1]
    assert alternate(cfgs, 2) == cfgs


def test_the_report_writes_its_json_and_plots_for_every_workload(tmp_path: Any) -> None:
    import json

    from bench.colocation_report import report

    runs = {"static": [fake_run({"a": [1.0] * 50, "b": [2.0] * 50}) for _ in range(2)],
            "demand": [fake_run({"a": [0.5] * 50, "b": [1.0] * 50}, resizes=1) for _ in range(2)]}  # fmt: skip
    for r in (*runs["static"], *runs["demand"]):
        r["integrity_ok"] = {"a": True, "b": True}
    report({"bursts": runs}, {"drift": "machine speed: steady"}, tmp_path)
    data = json.loads((tmp_path / "bench_colocation.json").read_text())
    assert data["summary"]["bursts"]["demand"]["overall"]["repeats"] == 2
    assert len(data["runs"]["bursts"]["static"]) == 2
    assert all((tmp_path / f"bench_colocation_bursts_{k}.png").stat().st_size > 0 for k in ("memory", "ttft_cdf"))
    from bench.colocation_readme import table

    rows = table(data).splitlines()
    assert rows[2].startswith("| bursts | static | 2.00 s | 2.00 s |  |")  # static in seconds
    # the others as ratios to static: a halves, b halves, so does the worst model
    assert rows[3].startswith("| bursts | demand | 0.50x | 0.50x | 0.50-0.50x | ")
    assert rows[3].endswith("| 0.50x |")


def test_the_engines_run_float32_on_the_cpu_unless_told_otherwise() -> None:
    from pathlib import Path

    def dtype_of(setup: Setup) -> str | None:
        cmd = server_cmd(setup, Config("static", False), "a", (8000, 8100), 2, Path("/tmp/x"))
        return cmd[cmd.index("--vllm-args") + 1] if "--vllm-args" in cmd else None

    assert dtype_of(Setup("/m", "host", 16 * MiB, 32 * MiB, 1.0, 4.0, "float32")) == "--dtype float32"
    assert dtype_of(Setup("/m", "cuda", 16 * MiB, 32 * MiB, 1.0, 4.0)) is None  # the model's own
    assert (parse([]).dtype, parse(["--backend", "cuda"]).dtype) == ("float32", "auto")
    assert parse(["--dtype", "bfloat16"]).dtype == "bfloat16"


def test_the_calibration_interleaves_its_windows_so_a_linear_drift_biases_no_measure() -> None:
    from bench.colocation_calibrate import WHOLE, capacity_of, interleaved

    true = {WHOLE: 9.0, 2: 6.0, 3: 4.5}

    def drifting(calls: list[int]) -> Callable[[int, int], float]:
        def measure(n: int, r: int) -> float:  # the machine slows 5% a window: 1.0, 0.95, 0.90, ...
            calls.append(n)
            return true[n] * (1 - 0.05 * (len(calls) - 1))

        return measure

    calls: list[int] = []
    cap = capacity_of(interleaved(drifting(calls), [WHOLE, 2, 3], rounds=4), (2, 3), MiB, 28)
    assert calls == [1, 2, 3, 3, 2, 1, 1, 2, 3, 3, 2, 1]  # reversed every other round
    ratios = [cap.full_rps / true[WHOLE], cap.share_rps(2) / true[2], cap.share_rps(3) / true[3]]
    assert max(ratios) - min(ratios) < 1e-9  # every measure slowed alike
    # the same order every round instead: the whole budget, measured first, reads 15% fast against budget/3
    measure = drifting([])
    same: dict[int, list[float]] = {n: [] for n in true}
    for r in range(4):
        for n in true:
            same[n].append(measure(n, r))
    biased = capacity_of({n: tuple(w) for n, w in same.items()}, (2, 3), MiB, 28)
    assert (biased.full_rps / true[WHOLE]) / (biased.share_rps(3) / true[3]) == pytest.approx(1.148, abs=0.001)


def test_the_calibration_line_shows_each_measures_median_and_range() -> None:
    from bench.colocation_calibrate import WHOLE, capacity_of

    windows = {WHOLE: (9.0, 8.0, 10.0, 9.2), 2: (6.0, 5.5, 6.5, 6.1), 3: (4.5, 4.4, 4.6, 4.5)}
    line = capacity_of(windows, (2, 3), MiB, 28).line()
    assert line.startswith("calibration (req/s, median): whole budget 9.10 (8.00-10.00 over 4 windows), ")
    assert "budget/2 6.05 (5.50-6.50 over 4 windows)" in line
    assert line.endswith("memory-bound")


def test_each_round_logs_what_the_policy_weighed_and_what_it_made_of_it() -> None:
    """A stall is read from these afterwards: the observation, not the snapshot re-read while a
    shrink drained, beside the policy's per-request estimate of that round."""
    group = GroupPolicy(8 * MiB, (ModelBudget("a", MiB, 7 * MiB), ModelBudget("b", MiB, 7 * MiB)),
                        hysteresis_bytes=MiB // 4, max_step_bytes=4 * MiB, dwell_rounds=2)  # fmt: skip
    observed = {"a": Observation(4 * MiB, 3 * MiB, 2, running_requests=3, finished_total=7),
                "b": Observation(4 * MiB, 0, finished_total=1)}  # fmt: skip
    _, memory = plan_demand(group, observed, PodRound("p").memory)
    logged = seen(PodRound("p", observed=observed, memory=memory))
    assert logged["a"] | {"quiet": None, "slack": None, "surge": None, "short": None} == {
        "limit": 4 * MiB,
        "used": 3 * MiB,
        "running": 3,
        "waiting": 2,
        "preemptions": 0,
        "finished": 7,
        "per_request": MiB,
        "largest": 0,  # one round's reading is no measure of a request's size (the demand policy's)
        "quiet": None,
        "slack": None,
        "surge": None,
        "short": None,
    }
    assert (logged["b"]["running"], logged["b"]["per_request"]) == (0, 0)
