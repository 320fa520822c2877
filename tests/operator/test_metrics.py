"""The operator's series: a deleted group's label sets go, and so do those of a model that left
its group's spec; other groups keep theirs."""

from __future__ import annotations

from kvpool_operator import metrics
from prometheus_client import REGISTRY


def value(name: str, **labels: str) -> float | None:
    return REGISTRY.get_sample_value(name, labels)


def test_forget_removes_a_groups_label_sets_and_keeps_the_others() -> None:
    for group in ("gone", "kept"):
        metrics.BUDGET.labels("ns-m", group).set(100)
        metrics.DEGRADED.labels("ns-m", group).set(0)
        metrics.RESIZES.labels("ns-m", group, "a", "applied").inc()
    metrics.forget("ns-m", "gone")
    assert value("kvpool_group_budget_bytes", namespace="ns-m", group="gone") is None
    assert value("kvpool_operator_resizes_total", namespace="ns-m", group="gone", model="a", status="applied") is None
    assert value("kvpool_group_budget_bytes", namespace="ns-m", group="kept") == 100
    assert value("kvpool_operator_resizes_total", namespace="ns-m", group="kept", model="a", status="applied") == 1


def test_forget_with_the_remaining_models_drops_only_the_models_that_left() -> None:
    metrics.BUDGET.labels("ns-k", "g").set(100)
    for model in ("a", "b"):
        metrics.RESIZES.labels("ns-k", "g", model, "applied").inc()
    metrics.forget("ns-k", "g", keep_models=frozenset({"a"}))
    assert value("kvpool_operator_resizes_total", namespace="ns-k", group="g", model="a", status="applied") == 1
    assert value("kvpool_operator_resizes_total", namespace="ns-k", group="g", model="b", status="applied") is None
    assert value("kvpool_group_budget_bytes", namespace="ns-k", group="g") == 100  # the group stays
