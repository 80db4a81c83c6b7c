"""``corral usage`` against a live server, on SQLite and PostgreSQL: the table, ``--json``, the
window's flags (RFC 3339 or a span back from now) and its grouping."""

from __future__ import annotations

import argparse
import json

import pytest

from corral.cli.usage import moment
from corral.client import Client
from corral.domain.clock import from_rfc3339, to_rfc3339
from corral.worker.calls import WorkerClient
from tests.helpers import corral


def test_usage_table_and_json_by_pool(server, clock, capsys):
    with Client(server.url) as client, WorkerClient(server.url) as worker:
        worker.register_worker({"id": "w1", "resources": {"gpus": 4, "vram_mb": 1000, "cpus": 8}})
        for pool, gpus in (("team/a", 2), ("team/b", 1)):
            client.submit_body({"command": "train", "pool": pool, "resources": {"gpus": gpus, "cpus": 1}})
        for _ in range(2):  # one after the other: the second claimed waits for the first to end
            claimed = worker.claim("w1")
            assert claimed is not None
            clock.advance(1800)
            worker.done(claimed["id"], "w1", claimed["attempt"])
    since = to_rfc3339(clock.now() - 86400)
    code, out, err = corral(server, capsys, "usage", "--by", "pool", "--since", since)
    assert code == 0, err
    header, *rows = out.splitlines()
    assert header.split() == [
        "USER", "POOL", "GPU-HOURS", "CPU-HOURS", "ATTEMPTS", "JOBS", "WAIT-P50", "WAIT-P90",
    ]  # fmt: skip
    cells = [row.split() for row in rows]
    assert [row[:6] for row in cells] == [
        ["-", "team/a", "1.00", "0.50", "1", "1"],
        ["-", "team/b", "0.50", "0.50", "1", "1"],
    ]
    assert sorted((row[6], row[7]) for row in cells) == [("0", "0"), ("1800", "1800")]
    code, out, err = corral(server, capsys, "usage", "--json", "--by", "user,pool", "--since", since)
    assert code == 0, err
    page = json.loads(out)
    assert page["since"] == since
    assert [(item["pool"], item["gpu_seconds"]) for item in page["items"]] == [
        ("team/a", 3600.0),
        ("team/b", 1800.0),
    ]


def test_a_bad_window_is_a_usage_error(server, capsys):
    code, _, err = corral(server, capsys, "usage", "--since", "last week")
    assert code == 2
    assert "span such as 7d" in err


def test_spans_count_back_from_now():
    now = from_rfc3339("2026-11-27T12:00:00Z")
    assert moment("7d", now) == "2026-11-20T12:00:00.000Z"
    assert moment("24h", now) == "2026-11-26T12:00:00.000Z"
    assert moment("90m", now) == "2026-11-27T10:30:00.000Z"
    assert moment("2026-11-01T00:00:00Z", now) == "2026-11-01T00:00:00Z"
    with pytest.raises(argparse.ArgumentTypeError):
        moment("7 days", now)
