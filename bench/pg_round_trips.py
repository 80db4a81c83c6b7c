"""Statements and round trips the PostgreSQL store sends per protocol request, from libpq's own
trace of the server's connections (``PGconn.trace``): a claim, a ``done``, a group of ``done``
reports (``change_many``), a worker heartbeat with and without its jobs' leases.

Counted per request, one request at a time on a live test server, after a warm-up (psycopg
prepares a statement at its fifth run, one round trip more that once): **round trips** are the
times the server waits for PostgreSQL (each ``Sync`` or simple ``Query`` message the client sends),
**statements** the ``Execute`` messages and the statements of each ``Query`` (``BEGIN`` and
``COMMIT`` among them).

    PYTHONPATH=src .venv/bin/python bench/pg_round_trips.py [--pg-url URL] [--verbose]
"""

from __future__ import annotations

import argparse
import os
import secrets
import sys
import tempfile
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

import httpx
import psycopg
from psycopg import pq

from corral.server.changes import done_decision
from corral.store import open_store
from corral.store.postgres import PostgresStore
from corral.testing.server import ServerThread

#: every traced connection's trace file, open for writing by libpq, and its path
TRACED: list[tuple[IO[str], Path]] = []


def trace_connections() -> None:
    """Make ``PostgresStore._connect`` trace every connection it opens into a file of its own."""
    original = PostgresStore._connect

    def connect(self: PostgresStore, lock_timeout_s: float) -> Any:
        connection = original(self, lock_timeout_s)
        path = Path(tempfile.mkstemp(prefix="corral-pgtrace-")[1])
        handle = path.open("w")
        connection.pgconn.trace(handle.fileno())
        connection.pgconn.set_trace_flags(pq.Trace.SUPPRESS_TIMESTAMPS | pq.Trace.REGRESS_MODE)
        TRACED.append((handle, path))
        return connection

    PostgresStore._connect = connect


def frontend_lines(offsets: dict[Path, int] | None = None) -> list[str]:
    """The client's messages in every trace (after ``offsets``, where given)."""
    lines = []
    for handle, path in TRACED:
        handle.flush()
        with path.open() as trace:
            trace.seek((offsets or {}).get(path, 0))
            lines += [line for line in trace.read().splitlines() if line.startswith("F\t")]
    return lines


def count(lines: list[str]) -> tuple[int, int, Counter[str]]:
    """Round trips, statements, and the messages by type."""
    messages: Counter[str] = Counter()
    statements = 0
    for line in lines:
        kind = line.split("\t")[2].split(" ")[0]
        messages[kind] += 1
        if kind == "Query":  # a simple query: one or several statements
            statements += line.count(";") + 1 - line.rstrip('"').endswith(";")
        elif kind == "Execute":
            statements += 1
    return messages["Sync"] + messages["Query"], statements, messages


def measure(label: str, action: Callable[[], object], verbose: bool) -> None:
    offsets = {path: path.stat().st_size for _, path in TRACED}
    action()
    lines = frontend_lines(offsets)
    round_trips, statements, messages = count(lines)
    if verbose:
        print("\n".join(line[:200] for line in lines))
    print(f"  {label:<44} {round_trips:>3} round trips {statements:>3} statements   {dict(messages)}")


def done(api: httpx.Client, job: dict[str, Any]) -> None:
    params = {"worker_id": "w1", "attempt": job["attempt"]}
    api.post(f"/jobs/{job['id']}/done", params=params, json={"exit_code": 0})


def claim(api: httpx.Client) -> dict[str, Any]:
    answer: dict[str, Any] = api.get("/jobs/next", params={"worker_id": "w1"}).json()
    return answer


def run(url: str, verbose: bool) -> None:
    store = open_store(url)
    with ServerThread(store) as server, httpx.Client(base_url=server.url, timeout=10) as api:
        resources = {"cpus": 64, "memory_mb": 65536}
        api.post("/workers/register", json={"id": "w1", "address": "127.0.0.1", "resources": resources})
        api.post("/jobs/batch", json={"jobs": [{"command": "true"} for _ in range(40)]})
        for _ in range(6):  # warm up: every statement prepared
            done(api, claim(api))
        claimed = [claim(api) for _ in range(9)]
        measure("claim (GET /jobs/next)", lambda: claimed.append(claim(api)), verbose)
        last = claimed.pop()
        measure("done (POST /jobs/{id}/done)", lambda: done(api, last), verbose)
        running = [job["id"] for job in claimed]
        leases = [{"id": job["id"], "attempt": job["attempt"], "progress": {"step": 1}} for job in claimed]
        for _ in range(6):
            api.post("/workers/w1/heartbeat", json={"gpus": [], "running": running, "jobs": leases})
            api.post("/workers/w1/heartbeat", json={"gpus": [], "running": running})
        measure(
            f"worker heartbeat with {len(leases)} leases",
            lambda: api.post("/workers/w1/heartbeat", json={"gpus": [], "running": running, "jobs": leases}),
            verbose,
        )
        measure(
            "worker heartbeat, no leases",
            lambda: api.post("/workers/w1/heartbeat", json={"gpus": [], "running": running}),
            verbose,
        )
        decisions = [(job["id"], done_decision("w1", job["attempt"], 2e9)) for job in claimed]
        measure(
            f"group of {len(decisions)} done reports (change_many)",
            lambda: server.state.store.jobs.change_many(decisions),
            verbose,
        )
    store.close()


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    default_url = os.environ.get("CORRAL_TEST_POSTGRES", "postgresql://postgres@127.0.0.1:5432/test")
    parser.add_argument("--pg-url", default=default_url, help="database a fresh schema is made in")
    parser.add_argument("--verbose", action="store_true", help="print the client's messages too")
    args = parser.parse_args()
    trace_connections()
    schema = "rt_" + secrets.token_hex(4)
    with psycopg.connect(args.pg_url, autocommit=True) as connection:
        connection.execute(f"CREATE SCHEMA {schema}")
    try:
        run(f"{args.pg_url}?options=-csearch_path%3D{schema}", args.verbose)
    finally:
        with psycopg.connect(args.pg_url, autocommit=True) as connection:
            connection.execute(f"DROP SCHEMA {schema} CASCADE")
        for handle, path in TRACED:
            handle.close()
            path.unlink()
    return 0


if __name__ == "__main__":
    sys.exit(main())
