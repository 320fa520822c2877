"""The README's picture of the dashboard: its panels drawn with matplotlib from a real
Prometheus's range queries (``make dashboard-picture``; the monitoring test calls it after its
load), so a reader sees what the dashboard shows before installing Grafana."""

from __future__ import annotations

import json
import math
import re
import time
from pathlib import Path
from typing import Any

import httpx

from tests.helm.monitoring import Prometheus

DASHBOARD = Path(__file__).parents[2] / "helm" / "kvpool" / "dashboards" / "kvpool.json"
UNITS = {"bytes": (1 << 20, "MiB"), "s": (1, "s"), "reqps": (1, "req/s"), "percentunit": (0.01, "%")}


def legend(fmt: str, labels: dict[str, str]) -> str:
    return re.sub(r"\{\{\s*(\w+)\s*\}\}", lambda m: labels.get(m.group(1), ""), fmt).strip()


def series(prom: Prometheus, expr: str, start: float, end: float) -> list[dict[str, Any]]:
    params = {"query": expr, "start": start, "end": end, "step": 1}
    result: list[dict[str, Any]] = httpx.get(prom.url + "/api/v1/query_range", params=params, timeout=30).json()[
        "data"
    ]["result"]
    return result


def draw(prom: Prometheus, out: Path, minutes: float = 2.0, columns: int = 3) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    dash = json.loads(DASHBOARD.read_text())
    panels = [p for p in dash["panels"] if p["type"] != "row" and "$model" not in p["title"]]
    end = time.time()
    rows = math.ceil(len(panels) / columns)
    fig, axes = plt.subplots(rows, columns, figsize=(6 * columns, 3.2 * rows), squeeze=False)
    for ax, panel in zip(axes.flat, panels, strict=False):
        scale, unit = UNITS.get(panel["fieldConfig"]["defaults"].get("unit", ""), (1, ""))
        for t in panel["targets"]:
            expr = re.sub(r"\$(namespace|group|model)\b", ".*", t["expr"])
            for s in series(prom, expr, end - minutes * 60, end):
                xs = [float(v[0]) - end for v in s["values"]]
                ys = [float(v[1]) / scale for v in s["values"]]
                ax.plot(xs, ys, label=legend(t.get("legendFormat", ""), s["metric"]), linewidth=1.2)
        ax.set_title(panel["title"], fontsize=9)
        ax.set_xlabel("seconds (0 = now)", fontsize=7)
        ax.set_ylabel(unit, fontsize=7)
        ax.tick_params(labelsize=7)
        if ax.lines:
            ax.legend(fontsize=6, loc="upper left")
    for ax in list(axes.flat)[len(panels) :]:
        ax.axis("off")
    fig.suptitle("kvpool dashboard, drawn from a real Prometheus after a short load (make dashboard-picture)")
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=80)
    plt.close(fig)
