"""The claim with a deep backlog of work that cannot start: the server's claim path on a real store.

Fills a fresh store, straight through the store API (no HTTP server): ``--workers`` (16) workers of
8 GPUs, all idle; a pool ``home`` guaranteed every GPU, and using none;
then ``--pending`` (20,000) pending single jobs of one GPU in pool ``guest``: all but ``--startable``
(64) are class 8 without checkpoints (no preemption could take them back, so the claim's borrowing
rule refuses them: they would sit on capacity ``home`` is guaranteed), queued ahead of the
``--startable`` class-5 jobs that may borrow. Then workers claim, one job a claim, until every
startable job runs; each claim reads past the refused backlog.

Printed per backend: the claims' count, the median and max wall time of one claim and this
process's CPU per claim (PostgreSQL's own work is in its processes, not counted), and the machine
block. The same script runs on any commit whose ``changes.claim(store, worker_id, now)`` exists.

    .venv/bin/python bench/claim_backlog.py [--db sqlite,postgres] [--pending 20000]
"""

from __future__ import annotations

import argparse
import statistics
import time

import harness
import machine
from corral.core import lifecycle
from corral.domain.pools import PoolSettings
from corral.domain.records import JobSpec
from corral.domain.resources import Resources
from corral.server import changes
from corral.store import Store
from corral.store.base import WorkerRegistration
from corral.testing.clock import FakeClock

GPUS = 8


def fill(store: Store, clock: FakeClock, args: argparse.Namespace) -> list[str]:
    worker_ids = [f"w{index:03d}" for index in range(args.workers)]
    for worker_id in worker_ids:
        registration = WorkerRegistration(worker_id, "10.0.0.1", Resources(GPUS, 81920, 2_000_000, 96))
        harness.store_port(store, "workers").register_worker(registration, clock.now())
    harness.store_port(store, "pools").put_pool(
        "home", PoolSettings(guarantee=Resources(gpus=args.workers * GPUS)), clock.now()
    )
    harness.store_port(store, "pools").put_pool("guest", PoolSettings(), clock.now())
    refused = [
        JobSpec(command="true", name=f"locked-{index}", resources=Resources(gpus=1), pool="guest",
                preemption_class=8, checkpoint_mode="none")
        for index in range(args.pending - args.startable)
    ]  # fmt: skip
    startable = [
        JobSpec(command="true", name=f"free-{index}", resources=Resources(gpus=1), pool="guest",
                preemption_class=5, checkpoint_mode="auto")
        for index in range(args.startable)
    ]  # fmt: skip
    specs = refused + startable
    for start in range(0, len(specs), 1000):
        store.jobs.submit(lifecycle.submitted(specs[start : start + 1000], clock.advance(0.01)), clock.now())
    return worker_ids


def measure(backend: str, store: Store, args: argparse.Namespace) -> None:
    clock = FakeClock(1_800_000_000.0)
    worker_ids = fill(store, clock, args)
    walls: list[float] = []
    cpu = 0.0
    started_jobs = 0
    for turn in range(args.startable):
        worker_id = worker_ids[turn % len(worker_ids)]
        wall_start, cpu_start = time.perf_counter(), time.process_time()
        job = changes.claim(harness.store_port(store, "claims"), worker_id, clock.now)
        walls.append(time.perf_counter() - wall_start)
        cpu += time.process_time() - cpu_start
        started_jobs += job is not None
    assert started_jobs == args.startable, f"{started_jobs} of {args.startable} startable jobs started"
    print(
        f"{backend:>8}: {len(walls)} claims past {args.pending - args.startable} refused jobs:"
        f" median {1000 * statistics.median(walls):.2f} ms, max {1000 * max(walls):.2f} ms,"
        f" CPU {1000 * cpu / len(walls):.2f} ms a claim",
        flush=True,
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--db", default="sqlite,postgres")
    parser.add_argument("--workers", type=int, default=16)
    parser.add_argument("--pending", type=int, default=20_000)
    parser.add_argument("--startable", type=int, default=64)
    args = parser.parse_args()
    for backend in args.db.split(","):
        with harness.fresh_store(backend) as store:
            measure(backend, store, args)
    machine.print_machine()


if __name__ == "__main__":
    main()
