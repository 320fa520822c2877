"""The chart's Grafana dashboard and alert rules only name metrics that a running kvpool-server
(this session's real one, scraped over HTTP), the router and the operator really export."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import httpx
import pytest
import yaml
from prometheus_client import REGISTRY, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from tests.k8s.cluster import BIN
from tests.server.conftest import Server

pytestmark = [pytest.mark.e2e]
CHART = Path(__file__).parents[2] / "helm" / "kvpool"
NAME = re.compile(r"\b(kvpool_[a-z_]+|vllm:[a-z_:]+)")
RECORDED = re.compile(r"\b(kvpool:[a-z_:0-9]+)")
SUFFIXES = ("", "_total", "_bucket", "_sum", "_count")


def queries() -> list[str]:
    dash = json.loads((CHART / "dashboards" / "kvpool.json").read_text())
    exprs = [t["expr"] for p in dash["panels"] for t in p.get("targets", [])]
    exprs += [v["query"]["query"] for v in dash["templating"]["list"] if isinstance(v.get("query"), dict)]
    return exprs + [r["expr"] for r in rules()]


def rules() -> list[dict[str, str]]:
    cmd = [str(BIN / "helm"), "template", "kv", str(CHART), "--api-versions", "monitoring.coreos.com/v1"]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    (rule,) = [d for d in yaml.safe_load_all(out) if d and d["kind"] == "PrometheusRule"]
    return [r for g in rule["spec"]["groups"] for r in g["rules"]]


def exported(server: Server) -> set[str]:
    import kvpool_operator.metrics  # noqa: F401  (registers the operator's families)
    from kvpool_server.router.app import Router
    from kvpool_server.router.settings import RouterSettings

    router = Router(RouterSettings(upstream=["m=http://127.0.0.1:9"]))  # its families exist before any request
    families = list(text_string_to_metric_families(httpx.get(server.url + "/metrics", timeout=30).text))
    families += list(text_string_to_metric_families(generate_latest(REGISTRY).decode()))
    families += list(text_string_to_metric_families(generate_latest(router.registry).decode()))
    return {f.name + s for f in families for s in SUFFIXES}


def test_every_dashboard_and_alert_query_names_an_exported_metric(server: Server) -> None:
    names = exported(server)
    used = {n for q in queries() for n in NAME.findall(q)}
    assert len(used) >= 15  # the panels cover memory, resizes, tier, requests, TTFT, queue, the operator
    assert sorted(used - names) == []
    recorded = {r["record"] for r in rules() if "record" in r}
    wanted = {n for q in queries() for n in RECORDED.findall(q)}
    assert wanted
    assert sorted(wanted - recorded) == []  # every recorded series used is one the chart records
