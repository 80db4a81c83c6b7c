"""CPU of the PostgreSQL store's protocol calls, alone: no HTTP, no server threads, one thread
calling the store the way the server does (a claim, a ``done``, a group of four ``done`` reports,
a worker heartbeat with its 8 jobs' leases), measured by the calling thread's CPU time
(``time.thread_time``: user and system) and the PostgreSQL backend's (``/proc``, on this host).

``bench/protocol.py`` measures the same calls end to end, where the HTTP stack, the thread
handoffs and a noisy machine add as much as the store; this isolates the store's part, to compare
two versions run one after the other:

    PYTHONPATH=src .venv/bin/python bench/pg_store_cpu.py [--jobs 1500] [--pg-url URL]
        [--without-index NAME ...]   # what an index of the schema costs the claim and the report

``--without-index`` drops the named indexes from the bench's fresh schema before measuring: what
their upkeep costs the backend per job, to compare with a run that keeps them (every status change
of a job is a non-HOT update: it writes an entry in each full index and each partial index whose
predicate the new row meets; the updates of the measure and how many of them were HOT are printed).
"""

from __future__ import annotations

import argparse
import os
import secrets
import sys
import time
from collections.abc import Callable
from typing import Any

import psycopg
import psycopg.sql

from corral.core import lifecycle
from corral.core.claim import Claim
from corral.domain.records import Job, JobSpec
from corral.domain.resources import Resources
from corral.server.changes import done_decision
from corral.store import Store, open_store
from corral.store.base import JobReport, WorkerRegistration

NOW = 1_800_000_000.0
POLICY = Claim()


def backend_cpu_s(pid: int) -> float:
    """The PostgreSQL backend's CPU so far (user and system), from ``/proc`` (same host)."""
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def claimed(store: Store) -> Job:
    job = store.claims.claim("w1", NOW + 1, POLICY)
    assert job is not None, "the queue ran dry: submit more jobs (--jobs)"
    return job


def claims_and_dones(store: Store, count: int, group: int, pid: int | None = None) -> tuple[float, ...]:
    """CPU per claim and per ``done`` (us): ``group`` claims, then their reports in one call (one
    ``done``: ``change_many`` of one, as the server's group commit sends it). With ``pid``, the
    backend's too (its ``/proc`` counters tick every 10 ms: a sum over many calls)."""
    claiming = reporting = backend_claiming = backend_reporting = 0.0
    backend = (lambda: backend_cpu_s(pid)) if pid is not None else (lambda: 0.0)
    for _ in range(count // group):
        backend_started = backend()
        started = time.thread_time()
        jobs = [claimed(store) for _ in range(group)]
        claiming += time.thread_time() - started
        backend_middle = backend()
        middle = time.thread_time()
        store.jobs.change_many([(job.id, done_decision("w1", job.attempts, NOW + 2)) for job in jobs])
        reporting += time.thread_time() - middle
        backend_ended = backend()
        backend_claiming += backend_middle - backend_started
        backend_reporting += backend_ended - backend_middle
    return tuple(
        figure / count * 1e6 for figure in (claiming, reporting, backend_claiming, backend_reporting)
    )


def per_call_us(action: Callable[[int], object], count: int) -> float:
    started = time.thread_time()
    for index in range(count):
        action(index)
    return (time.thread_time() - started) / count * 1e6


def job_updates(store: Store, connection: psycopg.Connection[tuple[Any, ...]]) -> tuple[int, int]:
    """Updates of the ``jobs`` table so far and how many of them were HOT. A backend reports its
    counts at most once a second: the store's backend is told to report now (PostgreSQL 15's
    ``pg_stat_force_next_flush``, done as that call ends), then they are read afresh."""
    store.connection().execute("SELECT pg_stat_force_next_flush()")
    connection.execute("SELECT pg_stat_clear_snapshot()")
    row = connection.execute(
        "SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables WHERE relid = 'jobs'::regclass"
    ).fetchone()
    assert row is not None
    return int(row[0]), int(row[1])


def measure(store: Store, jobs: int, statistics: psycopg.Connection[tuple[Any, ...]]) -> None:
    # eight GPUs: the heartbeat below reports eight GPUs' readings (the jobs ask for none)
    store.workers.register_worker(WorkerRegistration("w1", "127.0.0.1", Resources(8, 80_000, 8192, 64)), NOW)
    specs = [JobSpec(command="true") for _ in range(jobs + 60)]
    store.jobs.submit(lifecycle.submitted(specs, NOW), NOW)
    claims_and_dones(store, 50, 1)  # warm up: every statement prepared
    pid = store.connection().info.backend_pid
    updates_before, hot_before = job_updates(store, statistics)
    claim_us, done_us, backend_claim_us, backend_done_us = claims_and_dones(store, jobs // 2, 1, pid)
    updates_after, hot_after = job_updates(store, statistics)
    group_claim_us, group_done_us, _, _ = claims_and_dones(store, jobs // 2 // 4 * 4, 4)
    leases = [claimed(store) for _ in range(8)]
    beats = [(job.id, job.attempts, JobReport(progress={"step": 1}, gpu_util_pct=90.0)) for job in leases]
    running = [job.id for job in leases]
    readings = [{"index": index, "util_pct": 90.0, "mem_used_mb": 1000} for index in range(8)]

    def heartbeat(index: int) -> None:
        store.workers.worker_heartbeat("w1", NOW + 3 + index, readings, None, running)
        store.jobs.heartbeat_jobs("w1", NOW + 3 + index, beats)

    beats_before, beats_hot_before = job_updates(store, statistics)
    heartbeat_us = per_call_us(heartbeat, 300)
    beats_after, beats_hot_after = job_updates(store, statistics)
    backend = f"(PostgreSQL backend: claim {backend_claim_us:5.0f} us, done {backend_done_us:5.0f} us)"
    print(f"  claim {claim_us:6.0f} us   done {done_us:6.0f} us   {backend}")
    print(f"  updates of jobs {updates_after - updates_before}, of them HOT {hot_after - hot_before}")
    print(
        f"  groups of 4: claim {group_claim_us:6.0f} us   done {group_done_us:6.0f} us per job (change_many)"
    )
    print(f"  worker heartbeat with 8 leases (worker_heartbeat + heartbeat_jobs) {heartbeat_us:6.0f} us")
    beat_updates, hot_beat_updates = beats_after - beats_before, beats_hot_after - beats_hot_before
    print(f"  updates of jobs by the heartbeats {beat_updates}, of them HOT {hot_beat_updates}")


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    default_url = os.environ.get("CORRAL_TEST_POSTGRES", "postgresql://postgres@127.0.0.1:5432/test")
    parser.add_argument("--pg-url", default=default_url, help="database a fresh schema is made in")
    parser.add_argument("--jobs", type=int, default=1500, help="claims and reports measured")
    parser.add_argument(
        "--without-index",
        action="append",
        default=[],
        metavar="NAME",
        help="drop this index before measuring",
    )
    args = parser.parse_args()
    schema = "cpu_" + secrets.token_hex(4)
    with psycopg.connect(args.pg_url, autocommit=True) as connection:
        connection.execute(f"CREATE SCHEMA {schema}")
    try:
        store = open_store(f"{args.pg_url}?options=-csearch_path%3D{schema}")
        try:
            with psycopg.connect(args.pg_url, autocommit=True) as statistics:
                statistics.execute(f"SET search_path = {schema}")
                for index in args.without_index:
                    statistics.execute(f"DROP INDEX {psycopg.sql.Identifier(index).as_string(statistics)}")
                if args.without_index:
                    print(f"  without {', '.join(args.without_index)}")
                measure(store, args.jobs, statistics)
        finally:
            store.close()
    finally:
        with psycopg.connect(args.pg_url, autocommit=True) as connection:
            connection.execute(f"DROP SCHEMA {schema} CASCADE")
    return 0


if __name__ == "__main__":
    sys.exit(main())
