"""The ColocatedModels spec: quantities parse, defaults apply, and every invalid field is named."""

from __future__ import annotations

from typing import Any

import pytest
from kvpool_operator.policy import Arbitration
from kvpool_operator.spec import SpecError, parse_group, quantity

GiB, MiB = 1 << 30, 1 << 20


def make_spec(**overrides: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "gpuMemoryBudgetBytes": "40Gi",
        "models": [
            {"name": "llama", "model": "/models/llama", "minBytes": "4Gi", "maxBytes": "30Gi", "weight": 2},
            {"name": "qwen", "model": "/models/qwen", "minBytes": 4 * GiB, "maxBytes": "30Gi"},
        ],
    }
    spec.update(overrides)
    return spec


def test_a_representative_spec_parses_with_defaults() -> None:
    group = parse_group(make_spec())
    assert group.policy.budget_bytes == 40 * GiB
    assert [(m.name, m.min_bytes, m.max_bytes, m.weight) for m in group.policy.models] == [
        ("llama", 4 * GiB, 30 * GiB, 2.0),
        ("qwen", 4 * GiB, 30 * GiB, 1.0),
    ]
    assert (group.interval_s, group.policy.hysteresis_bytes, group.policy.max_step_bytes) == (10.0, 64 * MiB, GiB)
    assert group.models[0].model == "/models/llama"
    assert (group.policy.arbitration, group.policy.dwell_rounds) == (Arbitration.DEMAND, 3)  # 3 intervals


def test_the_policy_and_its_dwell_are_chosen_in_the_spec() -> None:
    group = parse_group(make_spec(rebalance={"intervalSeconds": 4, "policy": "proportional", "minDwellSeconds": 10}))
    assert (group.policy.arbitration, group.policy.dwell_rounds) == (Arbitration.PROPORTIONAL, 3)  # ceil(10 / 4)


@pytest.mark.parametrize(("value", "expected"), [(5, 5), ("512Mi", 512 * MiB), ("3G", 3 * 10**9), ("7", 7)])
def test_quantities(value: Any, expected: int) -> None:
    assert quantity(value, "x") == expected


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"gpuMemoryBudgetBytes": "lots"}, "spec.gpuMemoryBudgetBytes: 'lots' is not a byte quantity"),
        ({"models": []}, "spec.models: list at least one model"),
        ({"models": [{"name": "A_b", "model": "m", "minBytes": 0, "maxBytes": 1}]}, "spec.models[0].name"),
        ({"models": [{"name": "a", "model": "m", "maxBytes": 1}]}, r"spec.models[0].minBytes is required"),
        ({"models": [{"name": "a", "model": "m", "minBytes": 5, "maxBytes": 4}]}, "minBytes (5) must not exceed"),
        ({"models": [{"name": "a", "model": "m", "minBytes": 0, "maxBytes": 4, "weight": 0}]}, ".weight: 0"),
        ({"rebalance": {"intervalSeconds": 0}}, "spec.rebalance.intervalSeconds"),
        ({"rebalance": {"policy": "greedy"}}, "spec.rebalance.policy: 'greedy' is not a policy; use one of demand"),
        ({"rebalance": {"minDwellSeconds": -1}}, "spec.rebalance.minDwellSeconds: -1 must be a number of seconds"),
        ({"gpuMemoryBudgetBytes": "6Gi"}, "add up to 8589934592 bytes, more than spec.gpuMemoryBudgetBytes"),
    ],
)
def test_invalid_specs_name_the_field(overrides: dict[str, Any], message: str) -> None:
    with pytest.raises(SpecError) as exc:
        parse_group(make_spec(**overrides))
    assert message in str(exc.value)


def test_duplicate_model_names_are_refused() -> None:
    models = [{"name": "a", "model": "m", "minBytes": 0, "maxBytes": 1}] * 2
    with pytest.raises(SpecError, match="names must be unique"):
        parse_group(make_spec(models=models))
