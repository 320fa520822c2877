"""The operator's own Prometheus series (``python -m kvpool_operator --metrics-port 8080``): what the
dashboard and alerts need beyond the servers' ``kvpool_*`` series -- each group's budget and
health, and the resizes it ordered."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

LABELS = ("namespace", "group")

BUDGET = Gauge("kvpool_group_budget_bytes", "GPU memory a group's KV pools may use together, per GPU.", LABELS)
DEGRADED = Gauge("kvpool_group_degraded", "1 while a group is Degraded (a server unreachable, a shrink stuck).", LABELS)
PODS = Gauge("kvpool_group_pods", "Pods (GPUs) of a group that the last round reached.", LABELS)
ROUNDS = Counter("kvpool_operator_rounds", "Rebalancing rounds run.", LABELS)
ROUND_SECONDS = Histogram("kvpool_operator_round_seconds", "Duration of one rebalancing round (all pods).", LABELS)
RESIZES = Counter(
    "kvpool_operator_resizes", "Limit changes the operator ordered, by outcome.", (*LABELS, "model", "status")
)

FAMILIES = (BUDGET, DEGRADED, PODS, ROUNDS, ROUND_SECONDS, RESIZES)


def forget(namespace: str, group: str, keep_models: frozenset[str] = frozenset()) -> None:
    """Remove a group's label sets (all of them when it is deleted; those of models no longer in
    its spec otherwise), so a dashboard stops showing what is gone instead of a flat last value."""
    for family in FAMILIES:
        names = family._labelnames  # prometheus_client keeps children per label tuple
        for values in list(family._metrics):  # no public way to list the children
            labels = dict(zip(names, values, strict=True))
            if (labels["namespace"], labels["group"]) != (namespace, group):
                continue
            if keep_models and ("model" not in labels or labels["model"] in keep_models):
                continue
            family.remove(*values)
