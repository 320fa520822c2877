"""The benchmarks' statistics and config comparison: paired ratios with a bootstrap interval, and
the side-by-side list of engine settings that differ."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench import common


def test_ratio_stats_pairs_rounds_by_position_and_brackets_the_median() -> None:
    base = [{"tps": 100.0}, {"tps": 200.0}, {"tps": 50.0}, {"tps": 80.0}, {"tps": 120.0}, {"tps": 90.0}]
    over = [{"tps": b["tps"] * r} for b, r in zip(base, [0.9, 1.0, 1.1, 0.95, 1.05, 1.0], strict=True)]
    s = common.ratio_stats(over, base)["tps"]
    assert s["median"] == pytest.approx(1.0)
    assert (s["min"], s["max"]) == pytest.approx((0.9, 1.1))
    assert s["min"] <= s["ci95_low"] <= s["median"] <= s["ci95_high"] <= s["max"]
    assert s["pairs"] == 6


def test_ratio_stats_refuses_unpaired_rounds() -> None:
    with pytest.raises(ValueError, match=r"shorter|longer"):
        common.ratio_stats([{"x": 1.0}], [{"x": 1.0}, {"x": 2.0}])


def test_paired_ratios_writes_every_config_against_the_base(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(common, "RESULTS", tmp_path)
    rounds = {"stock": [{"x": 2.0}, {"x": 4.0}], "a": [{"x": 1.0}, {"x": 2.0}], "b": [{"x": 4.0}, {"x": 8.0}]}
    out = common.paired_ratios("t", rounds, "stock", {"k": 1}, note="n")
    assert set(out) == {"a", "b"}
    assert out["a"]["x"]["median"] == pytest.approx(0.5)
    assert out["b"]["x"]["median"] == pytest.approx(2.0)
    written = json.loads((tmp_path / "t.json").read_text())
    assert written["base"] == "stock"
    assert written["note"] == "n"
    assert written["rounds"] == rounds


def test_config_differences_lists_only_settings_that_differ_and_skips_run_identities() -> None:
    stock = {"cache": {"blocks": 8192, "block_size": 32}, "instance_id": 1, "kv": None}
    ours = {"cache": {"blocks": 32768, "block_size": 32}, "instance_id": 2, "kv": {"engine_id": "x", "role": "both"}}
    diff = common.config_differences({"stock": stock, "ours": ours})
    assert diff == {
        "cache.blocks": {"stock": 8192, "ours": 32768},
        "kv.role": {"stock": None, "ours": "both"},
    }


def test_identical_configs_have_no_differences(capsys: pytest.CaptureFixture[str]) -> None:
    diff = common.config_differences({"a": {"x": {"y": 1}}, "b": {"x": {"y": 1}}})
    common.print_config_differences(diff)
    assert diff == {}
    assert "identical" in capsys.readouterr().out
