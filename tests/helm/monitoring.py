"""The monitoring half of the chart made runnable without the Prometheus operator: its
PrometheusRule as a rules file, its ServiceMonitors as Prometheus scrape configurations, and a
real Prometheus (Debian's 2.42 binary, fetched by ``make k8s-tools``) started on 127.0.0.1.

``scrape_config`` does what the Prometheus operator does with a ServiceMonitor (its
``generateServiceMonitorConfig``, EndpointSlice discovery): keep the targets whose Service
matches the selector and whose port has the endpoint's name, give them the namespace / service /
pod / container / job / endpoint labels, then apply the ServiceMonitor's own relabelings. So a
test scrapes through the chart's own objects, and the two cannot drift."""

from __future__ import annotations

import re
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import yaml

from tests.k8s.cluster import BIN, Cluster
from tests.server.conftest import free_port

PROMETHEUS, PROMTOOL = BIN / "prometheus", BIN / "promtool"
META = "__meta_kubernetes_"


def rule_groups(docs: list[dict[str, Any]]) -> dict[str, Any]:
    """A Prometheus rules file from the chart's one PrometheusRule."""
    (rule,) = [d for d in docs if d["kind"] == "PrometheusRule"]
    return {"groups": rule["spec"]["groups"]}


def _name(label: str) -> str:
    return re.sub(r"[^a-zA-Z0-9_]", "_", label)


def _selector(selector: dict[str, Any]) -> list[dict[str, Any]]:
    keep: list[dict[str, Any]] = []
    for k, v in sorted((selector.get("matchLabels") or {}).items()):
        src = [f"{META}service_label_{_name(k)}", f"{META}service_labelpresent_{_name(k)}"]
        keep.append({"action": "keep", "source_labels": src, "regex": f"({v});true"})
    for e in selector.get("matchExpressions") or []:
        label, present = f"{META}service_label_{_name(e['key'])}", f"{META}service_labelpresent_{_name(e['key'])}"
        op = e["operator"]
        if op in ("In", "NotIn"):
            keep.append({"action": "keep" if op == "In" else "drop", "source_labels": [label, present],
                         "regex": f"({'|'.join(e['values'])});true"})  # fmt: skip
        else:  # Exists / DoesNotExist
            keep.append({"action": "keep" if op == "Exists" else "drop", "source_labels": [present], "regex": "true"})
    return keep


def _relabeling(r: dict[str, Any]) -> dict[str, Any]:
    keys = {"sourceLabels": "source_labels", "targetLabel": "target_label", "replacement": "replacement",
            "regex": "regex", "action": "action", "separator": "separator"}  # fmt: skip
    return {keys[k]: v for k, v in r.items()}


TARGET_LABELS = [
    {
        "source_labels": [f"{META}endpointslice_address_target_kind", f"{META}endpointslice_address_target_name"],
        "regex": "Node;(.*)",
        "target_label": "node",
        "replacement": "$1",
    },
    {
        "source_labels": [f"{META}endpointslice_address_target_kind", f"{META}endpointslice_address_target_name"],
        "regex": "Pod;(.*)",
        "target_label": "pod",
        "replacement": "$1",
    },
    {"source_labels": [f"{META}namespace"], "target_label": "namespace"},
    {"source_labels": [f"{META}service_name"], "target_label": "service"},
    {"source_labels": [f"{META}pod_name"], "target_label": "pod"},
    {"source_labels": [f"{META}pod_container_name"], "target_label": "container"},
    {"source_labels": [f"{META}service_name"], "target_label": "job"},
]


def scrape_configs(monitor: dict[str, Any], sd: dict[str, Any], interval: str) -> list[dict[str, Any]]:
    """One scrape configuration per endpoint of a ServiceMonitor; ``sd`` is the API server's
    address and credentials, ``interval`` overrides the chart's (a test cannot wait 15 s)."""
    spec, ns = monitor["spec"], monitor["metadata"]["namespace"]
    nsel = spec.get("namespaceSelector") or {}
    names = [] if nsel.get("any") else (nsel.get("matchNames") or [ns])
    out = []
    for i, ep in enumerate(spec["endpoints"]):
        port = {"action": "keep", "source_labels": [f"{META}endpointslice_port_name"], "regex": ep["port"]}
        relabel = [*_selector(spec["selector"]), port, *TARGET_LABELS,
                   {"target_label": "endpoint", "replacement": ep["port"]},
                   *[_relabeling(r) for r in ep.get("relabelings") or []]]  # fmt: skip
        discovery = {"role": "endpointslice", **sd, **({"namespaces": {"names": names}} if names else {})}
        out.append({
            "job_name": f"serviceMonitor/{ns}/{monitor['metadata']['name']}/{i}", "scrape_interval": interval,
            "metrics_path": ep.get("path", "/metrics"), "honor_labels": bool(ep.get("honorLabels", False)),
            "kubernetes_sd_configs": [discovery], "relabel_configs": relabel,
        })  # fmt: skip
    return out


@dataclass
class Prometheus:
    url: str
    proc: subprocess.Popen[bytes]
    log: Path

    def query(self, expr: str) -> list[dict[str, Any]]:
        r = httpx.get(self.url + "/api/v1/query", params={"query": expr}, timeout=30)
        assert r.status_code == 200, f"{expr}: {r.text}"
        result: list[dict[str, Any]] = r.json()["data"]["result"]
        return result

    def targets(self) -> list[dict[str, Any]]:
        data = httpx.get(self.url + "/api/v1/targets", timeout=30).json()["data"]
        active: list[dict[str, Any]] = data["activeTargets"]
        return active

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=30)


def discovery_of(cluster: Cluster) -> dict[str, Any]:
    """kubernetes_sd's view of the test API server: the admin client certificate."""
    d = cluster.dir
    tls = {"ca_file": str(d / "ca.crt"), "cert_file": str(d / "admin.crt"), "key_file": str(d / "admin.key")}
    return {"api_server": cluster.url, "tls_config": tls}


def start_prometheus(d: Path, scrape: list[dict[str, Any]], rules: dict[str, Any]) -> Prometheus:
    (d / "rules.yaml").write_text(yaml.safe_dump(rules))
    config = {"global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
              "rule_files": [str(d / "rules.yaml")], "scrape_configs": scrape}  # fmt: skip
    (d / "prometheus.yml").write_text(yaml.safe_dump(config))
    port, log = free_port(), d / "prometheus.log"
    cmd = [str(PROMETHEUS), f"--config.file={d / 'prometheus.yml'}", f"--storage.tsdb.path={d / 'tsdb'}",
           f"--web.listen-address=127.0.0.1:{port}"]  # fmt: skip
    proc = subprocess.Popen(cmd, stdout=log.open("wb"), stderr=subprocess.STDOUT)
    prom = Prometheus(f"http://127.0.0.1:{port}", proc, log)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"prometheus exited:\n{log.read_text()[-3000:]}")
        try:
            if httpx.get(prom.url + "/-/ready", timeout=2).status_code == 200:
                return prom
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    proc.kill()
    raise RuntimeError(f"prometheus not ready:\n{log.read_text()[-3000:]}")
