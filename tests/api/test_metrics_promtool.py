"""``/metrics`` checked by Prometheus's own linter: ``promtool check metrics`` (Debian's
``prometheus`` package; ``.ci/run`` installs it) must pass on what the server exposes after real
traffic: jobs done, failed, cancelled, a gang admitted, a watchdog trip, logs stored and trimmed."""

from __future__ import annotations

import subprocess

from tests.api.conftest import claim, register, submit
from tests.helpers import admitted_and_running, promtool, send


def report(api, job, what, body=None):
    params = {"worker_id": job["worker_id"], "attempt": job["attempt"]}
    api.post(f"/jobs/{job['id']}/{what}", params=params, json=body or {}).raise_for_status()


def test_promtool_passes_on_metrics_after_real_traffic(server, settings, api):
    binary = promtool()
    settings.log_max_bytes = 8
    register(api, "solo", cpus=64, memory_mb=65536)
    submit(api, max_retries=1)
    done = claim(api, "solo")
    send(api, done, 0, b"hello world, over the cap\n")
    report(api, done, "done")
    submit(api, max_retries=1)
    report(api, claim(api, "solo"), "fail", {"exit_code": 3})
    submit(api)
    report(api, claim(api, "solo"), "watchdog", {"kind": "stall", "detail": "no progress"})
    cancelled = submit(api)
    api.post(f"/jobs/{cancelled['id']}/cancel").raise_for_status()
    admitted_and_running(api, server)
    server.reap()
    text = api.get("/metrics").text
    for name in (
        "corral_jobs_completed_total",
        "corral_log_bytes_dropped_total",
        "corral_watchdog_trips_total",
    ):
        assert name in text
    checked = subprocess.run(
        [binary, "check", "metrics"], input=text.encode(), capture_output=True, timeout=30
    )
    problems = (checked.stdout + checked.stderr).decode()
    assert checked.returncode == 0 and not problems.strip(), problems
