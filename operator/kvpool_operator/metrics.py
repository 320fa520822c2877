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
