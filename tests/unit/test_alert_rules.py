"""The shipped alert rules pass ``promtool check rules`` and their ``promtool test rules``
unit tests (tests/promtool/), and every alert has a test where it fires."""

from __future__ import annotations

import subprocess
from pathlib import Path

import yaml

from tests.support.programs import program

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "adapters" / "prometheus_alerts.yml"
RULE_TESTS = ROOT / "tests" / "promtool" / "prometheus_alerts_test.yml"


def _promtool(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([program("promtool", "prometheus"), *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)


def test_promtool_checks_the_rules():
    result = _promtool("check", "rules", str(RULES))
    assert result.returncode == 0, result.stdout + result.stderr
    alerts = [r for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"]]
    assert f"SUCCESS: {len(alerts)} rules found" in result.stdout + result.stderr


def test_promtool_unit_tests_of_the_rules_pass():
    result = _promtool("test", "rules", str(RULE_TESTS))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout + result.stderr


def test_every_alert_has_a_firing_and_a_silent_case():
    alerts = {r["alert"] for g in yaml.safe_load(RULES.read_text())["groups"]
              for r in g["rules"]}
    firing: set[str] = set()
    silent: set[str] = set()
    for case in yaml.safe_load(RULE_TESTS.read_text())["tests"]:
        for check in case.get("alert_rule_test", []):
            (firing if check.get("exp_alerts") else silent).add(check["alertname"])
    assert firing == alerts, alerts ^ firing
    assert silent == alerts, alerts ^ silent
