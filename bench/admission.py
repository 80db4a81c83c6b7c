"""The gang admission cycle (pure core): time per cycle on a large snapshot.

Builds, from a seed, a snapshot of ``--workers`` (2,000) active workers with ``--gpus`` (8) GPUs
each, about ``--busy`` (half) of them running 1-3 single jobs, ``--gangs`` (1,000) blocked gangs of
2-64 tasks asking for 1, 2, 4 or 8 GPUs per task (some with a label constraint, most with a
walltime), ``--stale`` (10) gangs with an expired reservation, and ``--pending`` (20,000) pending
single jobs. Then times ``corral.core.admission.decide`` on it ``--runs`` (7) times after one
warm-up run and prints the time per cycle (median, max) against the target (< 200 ms), what the
cycle decided, and the machine block. ``--profile`` runs one more cycle under cProfile and prints
the top functions. No server, no store: only the core.

Then the preemption case (issue 8): ``--workers`` workers with every GPU busy (single jobs of 1, 2
or 4 GPUs and a few running gangs, classes 0-9, mixed checkpoint modes and walltimes),
``--preemptors`` (500) pending single jobs and ``--preempting-gangs`` (100) blocked gangs of a
higher class: the same cycle with the preemption planner (target < 300 ms median), printed beside
the plain cycle above.

Then the fair-share case (issue 9): a tree of ``--pools`` (about 200) pools in 3 levels, every GPU
of ``--workers`` workers busy with one class of work spread unevenly over the leaves (a few pools
hold most), ``--pending`` (20,000) pending jobs of the same class over the leaves, a few blocked
gangs, every pool below its fair share starving: the whole cycle, fair share computed from the
pools' usage and demand plus admission and the planner, < 300 ms median.

    .venv/bin/python bench/admission.py
    .venv/bin/python bench/admission.py --profile
    .venv/bin/python bench/admission.py --cpu      # CPU time per cycle: for a loaded machine
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import io
import pstats
import random
import statistics
import sys
import time
from collections import Counter
from dataclasses import replace

import harness
import machine
from corral.core import fairshare
from corral.core.admission import decide
from corral.core.decisions import AdmissionDecisions
from corral.core.preemption import PreemptionSettings
from corral.core.snapshot import Gang, Snapshot
from corral.domain import pools
from corral.domain.records import Allocation, Constraints, Job, JobSpec, TopologyRequest, Worker
from corral.domain.resources import Resources
from corral.domain.status import Status, WorkerStatus

NOW = 1_700_000_000.0
TIMEOUT_S = 30.0
#: what a cycle is timed with: wall time, or with ``--cpu`` this process's CPU time (on a shared,
#: loaded machine the wall time mostly measures the other processes)
CLOCK = time.perf_counter


def build_snapshot(args: argparse.Namespace) -> Snapshot:
    rng = random.Random(args.seed)
    workers = [
        Worker(
            id=f"w-{index:05d}",
            address=f"10.0.{index // 250}.{index % 250}",
            resources=Resources(args.gpus, 81_920, 2_048_000, 12 * args.gpus),
            gpu_model="H100",
            labels={
                "zone": "a" if index % 2 == 0 else "b",
                "rack": f"r{index // 32:03d}",
                **(topology_labels(index) if args.topology else {}),
            },
            status=WorkerStatus.ACTIVE.value,
            registered_at=NOW - 86_400,
            last_heartbeat_at=NOW - 1,
        )
        for index in range(args.workers)
    ]
    allocations: list[Allocation] = []
    ends: dict[str, float] = {}
    job_number = 0
    for worker in workers:
        if rng.random() >= args.busy:
            continue
        free = list(range(args.gpus))
        for _ in range(rng.randint(1, 3)):
            gpus = min(rng.choice([1, 2, 4]), len(free))
            if gpus == 0:
                break
            job_number += 1
            job_id = f"j-run-{job_number:06d}"
            taken, free = tuple(free[:gpus]), free[gpus:]
            allocations.append(
                Allocation(job_id, worker.id, Resources(gpus, 40_000, 64_000 * gpus, 8 * gpus), taken)
            )
            if rng.random() < 0.7:
                ends[job_id] = NOW + rng.uniform(-60, 6 * 3600)
    gangs: list[Gang] = []
    for index in range(args.gangs):
        gpus = rng.choice([1, 2, 4, 8])
        size = rng.randint(2, 64)
        constraints = Constraints(labels={"zone": "a"}) if rng.random() < 0.1 else Constraints()
        spec = JobSpec(
            command="python train.py",
            gang_size=size,
            resources=Resources(gpus, 40_000, 64_000 * gpus, 8 * gpus),
            constraints=constraints,
            priority=rng.randint(0, 3),
            preemption_class=rng.randint(3, 7),
            walltime_s=rng.choice([None, 600.0, 1800.0, 3600.0, 4 * 3600.0]),
            topology=gang_topology(rng) if args.topology else None,
        )
        gang_id = f"g-{index:05d}"
        submitted = NOW - rng.uniform(0, 86_400)
        tasks = tuple(
            Job(f"{gang_id}-t{rank:02d}", spec, Status.BLOCKED, submitted, gang_id, rank)
            for rank in range(size)
        )
        gangs.append(Gang(gang_id, tasks))
    for index in range(args.stale):
        gang_id = f"g-stale-{index:03d}"
        spec = JobSpec(command="python train.py", gang_size=2, resources=Resources(1, 0, 0, 8))
        hosts = rng.sample(workers, 2)
        tasks = tuple(
            Job(
                f"{gang_id}-t{rank}",
                spec,
                Status.RESERVED,
                NOW - 600,
                gang_id,
                rank,
                worker_id=hosts[rank].id,
                gpu_indices=(args.gpus - 1,),
                reserved_at=NOW - 120,
            )
            for rank in range(2)
        )
        gangs.append(Gang(gang_id, tasks))
        allocations += [
            Allocation(task.id, hosts[rank].id, spec.resources, task.gpu_indices, Status.RESERVED)
            for rank, task in enumerate(tasks)
        ]
    pending = tuple(
        Job(
            f"j-pend-{index:06d}",
            JobSpec(command="true", resources=Resources(rng.choice([0, 1, 2]), 0, 16_000, 4)),
            Status.PENDING,
            NOW - rng.uniform(0, 3600),
        )
        for index in range(args.pending)
    )
    rng.shuffle(gangs)
    return Snapshot(NOW, tuple(workers), tuple(allocations), tuple(gangs), pending, ends)


def topology_labels(index: int) -> dict[str, str]:
    """``--topology``: racks of 16 hosts, blocks of 8 racks (128 hosts)."""
    return {"topology.block": f"b{index // 128:02d}", "topology.rack": f"r{index // 16:03d}"}


def gang_topology(rng: random.Random) -> TopologyRequest | None:
    """``--topology``: a fifth of the gangs require one rack, a fifth prefer one block."""
    draw = rng.random()
    if draw < 0.2:
        return TopologyRequest("topology.rack", required=True)
    if draw < 0.4:
        return TopologyRequest("topology.block", required=False)
    return None


def blocked_gang(gang_id: str, spec: JobSpec, submitted: float) -> Gang:
    """A gang of ``spec.gang_size`` tasks, every one blocked."""
    return Gang(
        gang_id,
        tuple(
            Job(f"{gang_id}-t{rank}", spec, Status.BLOCKED, submitted, gang_id, rank)
            for rank in range(spec.gang_size)
        ),
    )


def build_busy_snapshot(args: argparse.Namespace) -> Snapshot:
    """Every GPU busy with mixed classes; higher-class singles and gangs waiting (module docstring)."""
    rng = random.Random(args.seed + 1)
    workers = [
        Worker(
            id=f"w-{index:05d}",
            address=f"10.1.{index // 250}.{index % 250}",
            resources=Resources(args.gpus, 81_920, 2_048_000, 12 * args.gpus),
            gpu_model="H100",
            labels={
                "zone": "a" if index % 2 == 0 else "b",
                **(topology_labels(index) if args.topology else {}),
            },
            status=WorkerStatus.ACTIVE.value,
            registered_at=NOW - 86_400,
            last_heartbeat_at=NOW - 1,
        )
        for index in range(args.workers)
    ]
    asks = random.Random(args.seed + 3)  # the gangs' topology asks: the rest of the draw stays the same
    holding: list[Job] = []
    job_number = 0

    def running_spec(gpus: int, size: int = 1) -> JobSpec:
        return JobSpec(
            command="python train.py",
            gang_size=size,
            resources=Resources(gpus, 40_000, 64_000 * gpus, 8 * gpus),
            preemption_class=rng.randint(0, 9),
            checkpoint_mode=rng.choice(["none", "none", "auto", "manual"]),
            walltime_s=rng.choice([None, None, 3600.0, 4 * 3600.0]),
        )

    index = 0
    while index + 1 < len(workers):
        if rng.random() < 0.05:  # a running gang of two tasks on two whole workers
            gang_id = f"g-run-{index:05d}"
            spec = running_spec(args.gpus, 2)
            started = NOW - rng.uniform(60, 7200)
            holding.extend(
                Job(
                    f"{gang_id}-t{rank}", spec, Status.RUNNING, started - 10, gang_id, rank,
                    worker_id=workers[index + rank].id, gpu_indices=tuple(range(args.gpus)),
                    started_at=started, attempts=1,
                )
                for rank in range(2)
            )  # fmt: skip
            index += 2
            continue
        free = list(range(args.gpus))
        while free:
            gpus = min(rng.choice([1, 2, 4]), len(free))
            job_number += 1
            started = NOW - rng.uniform(60, 7200)
            taken, free = tuple(free[:gpus]), free[gpus:]
            holding.append(
                Job(
                    f"j-run-{job_number:06d}", running_spec(gpus), Status.RUNNING, started - 10,
                    worker_id=workers[index].id, gpu_indices=taken, started_at=started, attempts=1,
                    last_checkpoint_at=started + rng.uniform(0, 60) if rng.random() < 0.3 else None,
                )
            )  # fmt: skip
        index += 1
    pending = tuple(
        Job(
            f"j-want-{number:05d}",
            JobSpec(
                command="python serve.py",
                resources=Resources((gpus := rng.choice([1, 2, 4, 8])), 40_000, 64_000 * gpus, 8 * gpus),
                preemption_class=rng.randint(6, 10),
                priority=rng.randint(0, 3),
            ),
            Status.PENDING,
            NOW - rng.uniform(0, 600),
        )
        for number in range(args.preemptors)
    )
    gangs = []
    for number in range(args.preempting_gangs):
        gpus, size = rng.choice([1, 2, 4, 8]), rng.randint(2, 8)
        spec = JobSpec(
            command="python train.py",
            gang_size=size,
            resources=Resources(gpus, 40_000, 64_000 * gpus, 8 * gpus),
            preemption_class=rng.randint(6, 10),
            topology=gang_topology(asks) if args.topology else None,
        )
        gang_id = f"g-want-{number:04d}"
        submitted = NOW - rng.uniform(0, 600)
        gangs.append(blocked_gang(gang_id, spec, submitted))
    allocations = tuple(
        Allocation(job.id, job.worker_id or "", job.spec.resources, job.gpu_indices, job.status)
        for job in holding
    )
    return Snapshot(NOW, tuple(workers), allocations, tuple(gangs), pending, {}, holding=tuple(holding))


def pool_tree(count: int) -> list[str]:
    """The leaf paths of a tree of ``count`` pools in 3 levels: 5 organisations of 5 teams each,
    the rest projects dealt out over the teams."""
    teams = [f"org{org}/team{team}" for org in range(5) for team in range(5)]
    projects = max(1, count - 5 - len(teams))
    return [f"{teams[number % len(teams)]}/p{number // len(teams)}" for number in range(projects)]


def build_fair_share_inputs(
    args: argparse.Namespace,
) -> tuple[Snapshot, dict[str, pools.Pool], dict[str, pools.PoolUsage], Resources]:
    """The fair-share snapshot (module docstring), the resolved pools, their own usage and the cluster."""
    rng = random.Random(args.seed + 2)
    leaves = pool_tree(args.pools)
    heavy = leaves[: max(1, len(leaves) // 20)]  # 5% of the pools hold 80% of the GPUs
    workers = [
        Worker(
            id=f"w-{index:05d}",
            address=f"10.2.{index // 250}.{index % 250}",
            resources=Resources(args.gpus, 81_920, 2_048_000, 12 * args.gpus),
            gpu_model="H100",
            labels={},
            status=WorkerStatus.ACTIVE.value,
            registered_at=NOW - 86_400,
            last_heartbeat_at=NOW - 1,
        )
        for index in range(args.workers)
    ]
    usage: dict[str, pools.PoolUsage] = {}

    def count(path: str, resources: Resources, held: bool) -> None:
        before = usage.get(path, pools.PoolUsage())
        added = (
            pools.PoolUsage(resources, Resources(), 1) if held else pools.PoolUsage(Resources(), resources, 1)
        )
        usage[path] = before + added

    holding: list[Job] = []
    for worker in workers:
        free = list(range(args.gpus))
        while free:
            gpus = min(rng.choice([1, 2, 4]), len(free))
            taken, free = tuple(free[:gpus]), free[gpus:]
            pool = rng.choice(heavy) if rng.random() < 0.8 else rng.choice(leaves)
            spec = JobSpec(
                command="python train.py",
                resources=Resources(gpus, 40_000, 64_000 * gpus, 8 * gpus),
                preemption_class=5,
                checkpoint_mode=rng.choice(["none", "auto"]),
                pool=pool,
            )
            started = NOW - rng.uniform(60, 7200)
            job = Job(
                f"j-run-{len(holding):06d}", spec, Status.RUNNING, started - 10, worker_id=worker.id,
                gpu_indices=taken, started_at=started, attempts=1,
            )  # fmt: skip
            holding.append(job)
            count(pool, spec.resources, held=True)
    pending: list[Job] = []
    for number in range(args.pending):
        gpus = rng.choice([1, 2, 4, 8])
        spec = JobSpec(
            command="python train.py",
            resources=Resources(gpus, 40_000, 64_000 * gpus, 8 * gpus),
            preemption_class=5,
            pool=rng.choice(leaves),
        )
        pending.append(Job(f"j-want-{number:05d}", spec, Status.PENDING, NOW - rng.uniform(0, 3600)))
        count(spec.pool, spec.resources, held=False)
    gangs = []
    for number in range(args.gangs // 10):
        gpus, size = rng.choice([4, 8]), rng.randint(2, 4)
        spec = JobSpec(
            command="python train.py",
            gang_size=size,
            resources=Resources(gpus, 40_000, 64_000 * gpus, 8 * gpus),
            preemption_class=5,
            pool=rng.choice(leaves),
        )
        gang_id = f"g-want-{number:04d}"
        submitted = NOW - rng.uniform(0, 600)
        gangs.append(blocked_gang(gang_id, spec, submitted))
        count(spec.pool, Resources(gpus * size, 40_000, 64_000 * gpus * size, 8 * gpus * size), held=False)
    settings = {path: pools.PoolSettings(weight=rng.choice([1.0, 1.0, 2.0, 4.0])) for path in leaves}
    resolved = pools.resolve(settings, pools.PoolDefaults())
    total = Resources(
        args.gpus * args.workers, 81_920, 2_048_000 * args.workers, 12 * args.gpus * args.workers
    )
    # the server reads, besides the usual candidates, up to 1,000 pending jobs of the starving pools
    candidates = tuple(sorted(pending, key=lambda job: job.submitted_at)[:2000])
    allocations = tuple(
        Allocation(job.id, job.worker_id or "", job.spec.resources, job.gpu_indices, job.status)
        for job in holding
    )
    snapshot = Snapshot(
        NOW, tuple(workers), allocations, tuple(gangs), candidates, {}, holding=tuple(holding), pools=resolved
    )
    return snapshot, resolved, usage, total


def fair_share_case(args: argparse.Namespace) -> list[float] | None:
    harness.banner("admission cycle with fair share and the preemption planner (pure core)")
    snapshot, resolved, usage, total = build_fair_share_inputs(args)
    first_shares = fairshare.compute(resolved, usage, total)
    below = [path for path, share in first_shares.pools.items() if share.below]
    print(
        f"  snapshot: {len(resolved) - 1} pools ({len(pool_tree(args.pools))} leaves, 3 levels),"
        f" {len(snapshot.workers)} workers, every GPU busy ({len(snapshot.holding)} running jobs),"
        f" {args.pending} pending jobs ({len(snapshot.pending)} read as preemptors),"
        f" {len(snapshot.gangs)} gangs waiting; {len(below)} pools below their fair share"
    )
    # The usual cycle: the pools below their fair share have their timers running (10 s), nobody
    # starves yet. Then the cycle in which every one of them has starved for a minute: the cluster
    # rebalances at once, one preemptive placement per worker.
    timers = {path: pools.StarvationState(pools.Starvation.NON_STARVING, NOW - 10) for path in below}
    starved = {path: pools.StarvationState(pools.Starvation.STARVING, NOW - 60, NOW - 30) for path in below}
    results = []
    for label, previous in (("timers running", timers), ("every pool below starving", starved)):

        def cycle(previous: dict[str, pools.StarvationState] = previous) -> AdmissionDecisions:
            fair = fairshare.cycle_state(resolved, usage, total, previous, NOW)
            return decide(replace(snapshot, fair=fair), TIMEOUT_S, PreemptionSettings())

        first = cycle()
        times = []
        for _ in range(args.runs):
            started = CLOCK()
            decisions = cycle()
            times.append((CLOCK() - started) * 1000)
            if decisions != first:
                print("  ERROR: two cycles over the same snapshot decided differently")
                return None
        victims = Counter(victim.reason for found in first.preemptions for victim in found.victims)
        median = statistics.median(times)
        print(f"  {label}: {len(first.preemptions)} preemptions, victims {dict(victims)}")
        print(
            harness.figure("  time per cycle, median", median, "ms", args.preempt_target_ms, at_least=False)
        )
        print(
            harness.figure("  time per cycle, max", max(times), "ms", args.preempt_target_ms, at_least=False)
        )
        if first.preemptions:
            print(f"    {median / len(first.preemptions):.3f} ms per preemption decided")
        print(f"    runs: {', '.join(f'{t:.1f}' for t in times)} ms")
        results.extend(times)
    return results


def time_cycles(
    snapshot: Snapshot, runs: int, settings: PreemptionSettings | None
) -> tuple[AdmissionDecisions, list[float]] | None:
    first = decide(snapshot, TIMEOUT_S, settings)  # warm-up
    times = []
    for _ in range(runs):
        started = CLOCK()
        decisions = decide(snapshot, TIMEOUT_S, settings)
        times.append((CLOCK() - started) * 1000)
        if decisions != first:
            print("  ERROR: two cycles over the same snapshot decided differently")
            return None
    return first, times


def summary(snapshot: Snapshot, decisions: AdmissionDecisions) -> list[str]:
    tasks = sum(len(r.placements) for r in decisions.reservations)
    specs = {task.id: task.spec for gang in snapshot.gangs for task in gang.tasks}
    gpus = sum(specs[p.job_id].resources.gpus for r in decisions.reservations for p in r.placements)
    free_gpus = sum(w.resources.gpus for w in snapshot.workers) - sum(
        a.resources.gpus for a in snapshot.allocations
    )
    codes = Counter(w.reason.code for w in decisions.waiting)
    expected = {h.expected_at for h in decisions.holds}
    return [
        f"  snapshot: {len(snapshot.workers)} workers, {len(snapshot.allocations)} allocations, "
        f"{len(snapshot.gangs)} gangs ({sum(g.size for g in snapshot.gangs)} tasks), "
        f"{len(snapshot.pending)} pending single jobs, {free_gpus} GPUs free",
        f"  decided:  {len(decisions.rollbacks)} rollbacks, {len(decisions.reservations)} gangs reserved "
        f"({tasks} tasks, {gpus} GPUs), {len(decisions.holds)} holds "
        f"(expected_at {sorted(expected, key=lambda e: (e is None, e or 0))}), "
        f"waiting {dict(sorted(codes.items()))}",
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--workers", type=int, default=2000)
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--busy", type=float, default=0.5, help="share of workers running single jobs")
    parser.add_argument("--gangs", type=int, default=1000)
    parser.add_argument("--stale", type=int, default=10, help="gangs with an expired reservation")
    parser.add_argument("--pending", type=int, default=20_000)
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--target-ms", type=float, default=200.0)
    parser.add_argument("--preemptors", type=int, default=500, help="higher-class single jobs waiting")
    parser.add_argument("--preempting-gangs", type=int, default=100, help="higher-class gangs waiting")
    parser.add_argument("--preempt-target-ms", type=float, default=300.0)
    parser.add_argument("--pools", type=int, default=200, help="pools in the fair-share case (3 levels)")
    parser.add_argument(
        "--profile", action="store_true", help="one more cycle under cProfile (preemption case)"
    )
    parser.add_argument(
        "--topology",
        action="store_true",
        help="label the workers into blocks of 8 racks of 16 hosts (topology.block, topology.rack);"
        " a fifth of the gangs require one rack, a fifth prefer one block (the plain and the"
        " preemption cases)",
    )
    parser.add_argument("--plain-only", action="store_true", help="time the plain admission cycle only")
    parser.add_argument(
        "--cpu",
        action="store_true",
        help="time each cycle with this process's CPU time instead of the wall clock (a loaded machine)",
    )
    parser.add_argument(
        "--gc-freeze",
        action="store_true",
        help="gc.freeze() the snapshot before timing: the max without full collections walking it",
    )
    args = parser.parse_args(argv)
    global CLOCK
    CLOCK = time.process_time if args.cpu else time.perf_counter

    machine.print_machine()
    if args.cpu:
        print("  (times below: this process's CPU time per cycle, not the wall clock)")
    harness.banner("admission cycle (pure core)")
    started = time.perf_counter()
    snapshot = build_snapshot(args)
    print(f"  snapshot built in {time.perf_counter() - started:.2f} s (not timed below)")
    if args.gc_freeze:
        gc.collect()
        gc.freeze()
        print(f"  gc.freeze(): {gc.get_freeze_count()} objects out of the collector's reach")
    timed = time_cycles(snapshot, args.runs, None)
    if timed is None:
        return 1
    first, times = timed
    for line in summary(snapshot, first):
        print(line)
    print(
        harness.figure(
            "time per cycle, median", statistics.median(times), "ms", args.target_ms, at_least=False
        )
    )
    print(harness.figure("time per cycle, max", max(times), "ms", args.target_ms, at_least=False))
    print(f"  runs: {', '.join(f'{t:.1f}' for t in times)} ms")
    if args.plain_only:
        return 0

    harness.banner("admission cycle with the preemption planner (pure core)")
    busy = build_busy_snapshot(args)
    timed = time_cycles(busy, args.runs, PreemptionSettings())
    if timed is None:
        return 1
    planned, preempt_times = timed
    victims = Counter(victim.reason for found in planned.preemptions for victim in found.victims)
    gang_preemptors = sum(len(found.job_ids) > 1 for found in planned.preemptions)
    waiting = Counter(reason.code for _, reason in planned.single_waiting)
    waiting.update(entry.reason.code for entry in planned.waiting)
    print(
        f"  snapshot: {len(busy.workers)} workers, every GPU busy ({len(busy.holding)} running jobs),"
        f" {len(busy.pending)} higher-class single jobs and {len(busy.gangs)} gangs waiting"
    )
    print(
        f"  decided:  {len(planned.preemptions)} preemptions ({gang_preemptors} for gangs),"
        f" victims {dict(victims)}, waiting {dict(sorted(waiting.items()))}"
    )
    print(
        harness.figure(
            "time per cycle, median",
            statistics.median(preempt_times),
            "ms",
            args.preempt_target_ms,
            at_least=False,
        )
    )
    print(
        harness.figure(
            "time per cycle, max", max(preempt_times), "ms", args.preempt_target_ms, at_least=False
        )
    )
    print(f"  runs: {', '.join(f'{t:.1f}' for t in preempt_times)} ms")
    print(
        "  beside the plain cycle:"
        f" {statistics.median(preempt_times) / statistics.median(times):.2f}x its median"
    )
    if args.profile:
        profiler = cProfile.Profile()
        profiler.enable()
        decide(busy, TIMEOUT_S, PreemptionSettings())
        profiler.disable()
        out = io.StringIO()
        stats = pstats.Stats(profiler, stream=out)
        stats.sort_stats("tottime").print_stats(15)
        stats.sort_stats("cumulative").print_stats(15)
        print(out.getvalue())
    del snapshot, busy, first, planned  # each case times its own cycle, not the heap of the last
    gc.collect()
    return 0 if fair_share_case(args) is not None else 1


if __name__ == "__main__":
    sys.exit(main())
