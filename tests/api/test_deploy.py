"""deploy/: the alert rules pass promtool (syntax and their unit tests), every ``corral_*`` metric the
rules and the Grafana dashboard name is one the server exposes, and the systemd units run corral."""

from __future__ import annotations

import configparser
import json
import re
import subprocess
from pathlib import Path

from tests.helpers import promtool

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
RULES = DEPLOY / "prometheus" / "corral-alerts.yml"


def exposed_names(metrics_text: str) -> set[str]:
    """Every sample name the server's families can produce (histograms: _bucket, _sum, _count)."""
    names = set()
    for name, kind in re.findall(r"^# TYPE (\S+) (\S+)$", metrics_text, re.MULTILINE):
        names.add(name)
        if kind == "histogram":
            names.update({f"{name}_bucket", f"{name}_sum", f"{name}_count"})
    return names


def test_the_alert_rules_pass_promtool_and_their_unit_tests():
    binary = promtool()
    checked = subprocess.run([binary, "check", "rules", str(RULES)], capture_output=True, timeout=30)
    assert checked.returncode == 0, checked.stdout.decode() + checked.stderr.decode()
    tested = subprocess.run(
        [binary, "test", "rules", "corral-alerts.test.yml"], cwd=RULES.parent, capture_output=True, timeout=60
    )
    assert tested.returncode == 0, tested.stdout.decode() + tested.stderr.decode()


def test_rules_and_dashboard_name_only_metrics_the_server_exposes(api):
    exposed = exposed_names(api.get("/metrics").text)
    dashboard = json.loads((DEPLOY / "grafana" / "corral-dashboard.json").read_text())
    expressions = [target["expr"] for panel in dashboard["panels"] for target in panel["targets"]]
    assert expressions
    named = set(re.findall(r"corral_[a-z_]+", RULES.read_text() + "\n".join(expressions)))
    assert named, "no corral_* metric named"
    assert named - exposed == set(), "metrics the server does not expose"
    for alert in ("CorralWorkerFlaggedDead", "CorralJobsPendingWithFreeGpus", "CorralGangDrainsForceDrained"):
        assert f"alert: {alert}" in RULES.read_text()


def test_the_systemd_units_run_corral():
    for role in ("server", "worker"):
        unit = configparser.ConfigParser(strict=False, interpolation=None)
        unit.read(DEPLOY / "systemd" / f"corral-{role}.service")
        assert set(unit.sections()) == {"Unit", "Service", "Install"}
        assert unit["Service"]["ExecStart"].endswith(f"corral {role}")
        assert unit["Service"]["Restart"] == "always"
        assert unit["Install"]["WantedBy"] == "multi-user.target"


def test_the_worker_unit_runs_as_root_with_its_cgroup_subtree_delegated():
    unit = configparser.ConfigParser(strict=False, interpolation=None)
    unit.read(DEPLOY / "systemd" / "corral-worker.service")
    assert unit["Service"]["User"] == "root"
    assert unit["Service"]["Delegate"] == "yes"
