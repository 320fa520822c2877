"""The chart's dashboard JSON through Grafana's own model (PyPI ``grafana-foundation-sdk``, the
"Grafana next" schema): it parses, and a round trip keeps every key and value we wrote -- Grafana
fills its defaults in, but nothing of ours vanishes."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models.dashboard import Dashboard, Panel, RowPanel

DASHBOARD = Path(__file__).parents[2] / "helm" / "kvpool" / "dashboards" / "kvpool.json"


def lost(ours: Any, back: Any, path: str = "") -> list[str]:
    """Every key or value of ``ours`` that ``back`` does not carry (additions are Grafana's defaults)."""
    if isinstance(ours, dict):
        if not isinstance(back, dict):
            return [f"{path}: {back!r}"]
        return [x for k, v in ours.items()
                for x in (lost(v, back[k], f"{path}.{k}") if k in back else [f"{path}.{k} dropped"])]  # fmt: skip
    if isinstance(ours, list):
        if not isinstance(back, list) or len(back) != len(ours):
            return [f"{path}: length"]
        return [x for i, (a, b) in enumerate(zip(ours, back, strict=True)) for x in lost(a, b, f"{path}[{i}]")]
    return [] if ours == back else [f"{path}: {ours!r} -> {back!r}"]


def test_the_dashboard_parses_into_grafanas_model_and_a_round_trip_loses_nothing() -> None:
    ours = json.loads(DASHBOARD.read_text())
    model = Dashboard.from_json(ours)
    assert (model.title, model.uid) == ("kvpool", "kvpool-overview")
    assert model.panels is not None
    assert len(model.panels) == len(ours["panels"])
    kinds = {type(p) for p in model.panels}
    assert kinds == {Panel, RowPanel}  # the per-model row is a real row, not an unknown panel
    back = json.loads(json.dumps(model, cls=JSONEncoder))
    assert lost(ours, back) == []


def test_the_per_model_row_repeats_over_the_model_variable() -> None:
    ours = json.loads(DASHBOARD.read_text())
    variables = {v["name"] for v in ours["templating"]["list"]}
    rows = [p for p in ours["panels"] if p["type"] == "row"]
    assert [r["repeat"] for r in rows] == ["model"]
    assert "model" in variables
    after = ours["panels"][ours["panels"].index(rows[0]) + 1 :]
    assert after
    assert all("$model" in t["expr"] for p in after for t in p["targets"])
