"""The chart's alert and recording rules, evaluated by the real promtool: ``promtool check rules``
is clean and every alert's unit test (``rules/alerts.test.yaml``) passes -- it fires for its
fault after its ``for:``, not before, and never for a healthy group."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import yaml

from tests.helm.monitoring import PROMTOOL, rule_groups
from tests.helm.test_chart import MONITORING, render

TESTS = Path(__file__).parent / "rules" / "alerts.test.yaml"


def promtool(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(PROMTOOL), *args], capture_output=True, text=True, cwd=cwd, timeout=120)


def write_rules(d: Path) -> dict[str, object]:
    rules = rule_groups(render(*MONITORING))
    (d / "rules.yaml").write_text(yaml.safe_dump(rules))
    return rules


def test_the_rendered_rules_pass_promtool_check(tmp_path: Path) -> None:
    write_rules(tmp_path)
    out = promtool("check", "rules", "rules.yaml", cwd=tmp_path)
    assert out.returncode == 0, out.stdout + out.stderr


def test_every_alert_fires_for_its_fault_after_its_for_and_not_for_a_healthy_group(tmp_path: Path) -> None:
    rules = write_rules(tmp_path)
    shutil.copy(TESTS, tmp_path / TESTS.name)
    out = promtool("test", "rules", TESTS.name, cwd=tmp_path)
    assert out.returncode == 0, out.stdout + out.stderr
    alerts = {r["alert"] for g in rules["groups"] for r in g["rules"] if "alert" in r}  # type: ignore[attr-defined]
    cases = yaml.safe_load(TESTS.read_text())["tests"]
    fired = {t["alertname"] for c in cases for t in c.get("alert_rule_test", []) if t["exp_alerts"]}
    quiet = {t["alertname"] for c in cases if "healthy" in c["name"] for t in c["alert_rule_test"]}
    assert len(alerts) >= 6
    assert alerts - fired == set(), "alerts without a case where they fire"
    assert alerts - quiet == set(), "alerts not checked quiet on a healthy group"


def test_a_failing_expectation_fails_the_unit_test(tmp_path: Path) -> None:
    """The harness can fail: the same cases against rules whose server-down alert is the old
    ``kvpool_up == 0`` (no series when the server is gone) must not pass."""
    rules = write_rules(tmp_path)
    for g in rules["groups"]:  # type: ignore[attr-defined]
        for r in g["rules"]:
            if r.get("alert") == "KVPoolServerDown":
                r["expr"] = "kvpool_up == 0"
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump(rules))
    shutil.copy(TESTS, tmp_path / TESTS.name)
    out = promtool("test", "rules", TESTS.name, cwd=tmp_path)
    assert out.returncode == 1
    assert "a model server that is gone entirely" in out.stdout + out.stderr
