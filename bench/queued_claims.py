"""The store's CPU per job of a claim and its ``done`` with a queue already full: no HTTP server.

Fills a fresh store through the store API with ``--jobs`` (4,000) pending no-op jobs, in batches of
1,000, before any claim; then ``--workers`` (8) workers claim ``--claim-max`` (8) jobs each in one
group (``claim_group``, as one event-loop turn of the server makes it) and report each group of
``--claim-max`` dones with ``change_many``, until every job is done. ``bench/protocol.py`` submits
while it claims, so its queue stays short; this is the case a deep queue makes (SQLite's page
cache, ``store.sqlite.CACHE_KIB``). Printed per backend: this process's CPU and wall time per job
(PostgreSQL's own work is in its processes, not counted), and the machine block.

    PYTHONPATH=src .venv/bin/python bench/queued_claims.py [--db sqlite,postgres] [--jobs 4000]
"""

from __future__ import annotations

import argparse
import time
from typing import Any

import harness
import machine
from corral.core import lifecycle
from corral.core.claim import Claim
from corral.domain.records import JobSpec
from corral.domain.resources import Resources
from corral.server import changes
from corral.store.base import ClaimAsk, WorkerRegistration


def measure(backend: str, store: Any, args: argparse.Namespace) -> None:
    now = time.time()
    workers = [f"w{index}" for index in range(args.workers)]
    for worker_id in workers:
        store.workers.register_worker(
            WorkerRegistration(worker_id, "127.0.0.1", Resources(0, 0, 64_000, 64)), now
        )
    for start in range(0, args.jobs, 1000):
        specs = [
            JobSpec(command="true", name=f"noop-{index}")
            for index in range(start, min(start + 1000, args.jobs))
        ]
        store.jobs.submit(lifecycle.submitted(specs, now), now)
    policy = Claim()
    done = 0
    cpu, wall = time.process_time(), time.perf_counter()
    while done < args.jobs:
        asks = [ClaimAsk(worker_id, args.claim_max, None) for worker_id in workers]
        for claimed in changes.claim_group(store.claims, asks, time.time, policy):
            reports = [
                (job.id, changes.done_decision(job.worker_id or "", job.attempts, time.time()))
                for job in claimed
            ]
            if reports:
                outcomes = store.jobs.change_many(reports)
                refused = [outcome for outcome in outcomes if isinstance(outcome, Exception)]
                if refused:
                    raise SystemExit(f"a done was refused: {refused[0]!r}")
            done += len(claimed)
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    print(
        f"{backend}: {args.jobs} jobs queued first, claims of {args.claim_max} by {args.workers} workers:"
        f" CPU {1e6 * cpu / args.jobs:.0f} us/job, wall {1e6 * wall / args.jobs:.0f} us/job"
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--db", default="sqlite,postgres")
    parser.add_argument("--jobs", type=int, default=4000)
    parser.add_argument("--workers", type=int, default=8)
    parser.add_argument("--claim-max", type=int, default=8)
    args = parser.parse_args()
    for backend in args.db.split(","):
        with harness.fresh_store(backend) as store:
            measure(backend, store, args)
    machine.print_machine()


if __name__ == "__main__":
    main()
