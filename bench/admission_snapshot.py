"""The admission loop's snapshot read and whole pass on a real store, at fleet size (issue 13).

Fills a fresh store, straight through the store API (no HTTP server), as ``fleet.py``'s load
window sees it: ``--workers`` (2,000) workers of ``--gpus`` (8) GPUs, each running
``--jobs-per-worker`` (8) single jobs of class 10 (every GPU busy, nothing preemptible), then
``--pending`` (20,000) pending single jobs of one GPU and ``--gangs`` (500) blocked gangs of
4 x all GPUs, class 10. Then, ``--rounds`` (5) times: every running job heartbeats (progress, GPU
utilisation, RSS: one ``heartbeat_jobs`` transaction per worker, as ``--batched`` hosts send them,
not timed), then ``store.gangs.admission_inputs`` is timed, then a whole ``admission_tick`` (which reads
the snapshot again: the second read finds no heartbeat in between). Printed: the median and max of
each's wall time and the median of this process's CPU time (the database's own work on PostgreSQL
is in its processes, not counted), per backend, with the machine block.

    .venv/bin/python bench/admission_snapshot.py [--db sqlite,postgres] [--workers 2000]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from typing import TypeVar

import harness
import machine
from corral.config import ServerSettings
from corral.core import lifecycle
from corral.domain.records import JobSpec
from corral.domain.resources import Resources
from corral.server import changes
from corral.server.loops.admission import admission_tick
from corral.server.state import ServerState
from corral.store import Store
from corral.store.base import JobReport, WorkerRegistration
from corral.testing.clock import FakeClock

T = TypeVar("T")


def fill(store: Store, clock: FakeClock, args: argparse.Namespace) -> dict[str, list[tuple[str, int]]]:
    """The fleet as ``fleet.py`` loads it; answers worker id -> its running (job id, attempt)."""
    worker_ids = [f"fleet-w{index:05d}" for index in range(args.workers)]
    for worker_id in worker_ids:
        harness.store_port(store, "workers").register_worker(
            WorkerRegistration(worker_id, "10.0.0.1", Resources(args.gpus, 81920, 2_000_000, 96)), clock.now()
        )
    per_job = max(1, args.gpus // args.jobs_per_worker)
    running = [
        JobSpec(command="sleep 3600", name=f"running-{index}", resources=Resources(gpus=per_job, cpus=1),
                preemption_class=10)
        for index in range(args.workers * args.jobs_per_worker)
    ]  # fmt: skip
    submit_in_batches(store, clock, running)
    held: dict[str, list[tuple[str, int]]] = {}
    for worker_id in worker_ids:
        claimed = changes.claim_many(
            harness.store_port(store, "claims"), worker_id, clock.now, args.jobs_per_worker
        )
        held[worker_id] = [(job.id, job.attempts) for job in claimed]
    pending = [
        JobSpec(
            command="true", name=f"pending-{index}", resources=Resources(gpus=1, cpus=1), preemption_class=10
        )
        for index in range(args.pending)
    ]
    gangs = [
        JobSpec(command="train", name=f"gang-{index}", gang_size=4,
                resources=Resources(gpus=args.gpus, cpus=1), preemption_class=10)
        for index in range(args.gangs)
    ]  # fmt: skip
    submit_in_batches(store, clock, pending + gangs)
    return held


def submit_in_batches(store: Store, clock: FakeClock, specs: list[JobSpec]) -> None:
    for start in range(0, len(specs), 1000):
        store.jobs.submit(lifecycle.submitted(specs[start : start + 1000], clock.advance(0.01)), clock.now())


def heartbeat_all(
    store: Store, clock: FakeClock, held: dict[str, list[tuple[str, int]]], round_: int
) -> None:
    now = clock.advance(5.0)
    for worker_id, jobs in held.items():
        report = JobReport(progress={"step": round_}, gpu_util_pct=50.0 + round_, rss_mb=1000.0 + round_)
        store.jobs.heartbeat_jobs(worker_id, now, [(job_id, attempt, report) for job_id, attempt in jobs])


def run(backend: str, args: argparse.Namespace) -> None:
    with harness.fresh_store(backend) as store:
        measure(backend, store, args)


def measure(backend: str, store: Store, args: argparse.Namespace) -> None:
    clock = FakeClock()
    started = time.perf_counter()
    held = fill(store, clock, args)
    print(f"{backend}: filled in {time.perf_counter() - started:.1f}s", flush=True)
    # Long timeouts: the fake clock moves 5 s a round, and nothing here may expire.
    settings = ServerSettings(store_threads=0, reservation_timeout_s=3600.0)
    state = ServerState(store=store, settings=settings, clock=clock)
    reads: list[tuple[float, float]] = []
    ticks: list[tuple[float, float]] = []
    # warm: the first pass writes the waiting reasons, the second reads the rows it changed
    admission_tick(state)
    admission_tick(state)
    for round_ in range(args.rounds):
        heartbeat_all(store, clock, held, round_)
        inputs = timed(reads, lambda: harness.store_port(store, "gangs").admission_inputs())
        timed(ticks, lambda: admission_tick(state))
    print(
        f"{backend}: {len(inputs.holding)} holding, {len(inputs.pending)} pending read,"
        f" {len(inputs.gangs)} gangs, {len(inputs.workers)} workers"
    )
    print(f"  admission_inputs after heartbeats: {figures(reads)}")
    print(f"  admission_tick: {figures(ticks)}", flush=True)


def timed(into: list[tuple[float, float]], work: Callable[[], T]) -> T:
    """``work()``, its wall time and this process's CPU time appended to ``into``."""
    wall, cpu = time.perf_counter(), time.process_time()
    result = work()
    into.append((time.perf_counter() - wall, time.process_time() - cpu))
    return result


def figures(times: list[tuple[float, float]]) -> str:
    """Median and max of the wall times (each listed), and the median of this process's CPU time:
    on a shared machine the CPU time is the steadier figure."""
    walls = [wall for wall, _ in times]
    each = ", ".join(f"{wall * 1000:.0f}" for wall in walls)
    cpu = statistics.median(cpu for _, cpu in times)
    return (
        f"median {statistics.median(walls) * 1000:.0f} ms, max {max(walls) * 1000:.0f} ms ({each});"
        f" CPU median {cpu * 1000:.0f} ms"
    )


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--db", default="sqlite,postgres", help="backends, comma-separated")
    parser.add_argument("--workers", type=int, default=2000)
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--jobs-per-worker", type=int, default=8)
    parser.add_argument("--pending", type=int, default=20_000)
    parser.add_argument("--gangs", type=int, default=500)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    machine.print_machine()
    for backend in args.db.split(","):
        run(backend, args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
