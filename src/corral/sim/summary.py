"""The figures of a run: the ``--json`` summary of shared/API.md, overall and per pool.

Definitions (the README's "Simulating a cluster" says the same):

- **queueing delay** of a workload job: from its submission to its first start (a gang: to the
  start of its last task, when it runs whole); jobs that never started are counted apart
  (``unfinished``);
- **job completion time** (``jct_s``): submission to the end of its last task;
- **makespan**: first submission to the last end;
- **GPU allocation**: GPUs busy with work (running, or preempting: a victim holds its GPUs until it
  has exited) integrated over the makespan, divided by the cluster's GPUs times the makespan;
  **GPU reserved** the same for the GPUs reserved for work not started yet (a gang's tasks waiting
  for their claims, a preemptor waiting for its victims to leave): room held, not used. Both
  policies are counted alike. A preemptor reserved on GPUs its victims still hold counts in both
  (the victims' GPUs are busy until they exit): busy alone never exceeds 100%;
- **GPU-hours lost** to preemption: each victim's GPUs times the work it did since what it resumes
  from (its checkpoint phase's save, its own last periodic checkpoint, or its start);
- **gangs over the bound**: gangs (``gang_size`` > 1) whose queueing delay exceeded
  ``starvation_bound_s`` (6 h by default), or that never started, whatever kept them waiting;
- **starved gangs**: those of them that waited longer than the bound *while their pool held less
  than its starvation tolerance (0.8) times its fair share of the GPUs*: the time the scheduler owed
  the pool capacity and did not give it (corral's own definition of starving, seed 002's, counted
  for the gang). A gang of a pool at its fair share waits behind its own pool's work: that is
  fair share at work, not starvation. The fair share is the one below (not the server's
  demand-capped one), the same for every policy, so the figure compares policies;
- **starved gangs within share** (``starved_gangs_within_share``): those starved gangs whose
  owed wait (over the bound) fell while the gang itself fitted in its pool's share: the pool held
  less than its tolerance times its fair share *and* its GPUs plus the gang's were at most that
  share. Fair share entitles a starving pool to capacity up to its share (DESIGN.md: a starving
  pool "may take resources from allocations that its pool's share entitles it to"), so this is
  the capacity owed to the gang itself; a gang larger than its pool's whole share (a 16 x 8 gang
  of a pool with a 24-GPU share) starts only on room its pool borrows, which nothing owes it.
  Reported beside ``starved_gangs`` and ``gangs_over_bound``, not instead of them;
- **peak gang load**: the most GPU-time that gangs asked for within one window of the bound's
  length, as a multiple of what the cluster can run in that window: above 1, the gangs of that
  window alone ask for more GPU-time than the whole cluster has in it, so some of them wait long
  behind the others whatever the policy (it says how hard the workload is, not what a policy did);
- **fair share** of a pool: its guarantee's fraction of the guaranteed GPUs when any pool has a
  guarantee, else its weight's fraction of the weights of the pools that have jobs;
  ``fair_share_gpu_hours`` is that fraction of the cluster's GPU-hours over the makespan;
- **light pools**: those whose demand (GPU-hours asked) is at most their fair share of the
  cluster's GPU-hours over the arrival window (first to last submission); **heavy pools** the
  others (``light_pools``/``heavy_pools``: their jobs' queueing delay together);
- **estimated-start accuracy** (``estimated_start``): each gang or job that got an estimated
  start while it waited (its reservation's start, what ``corral jobs --start`` shows) and then
  started, its first estimate against its actual start: the error in seconds
  (|actual - estimated|), and the error as a fraction of its wait (submission to start), p50/p90;
  ``early``/``late``: how many started before/after their first estimate (by more than one
  admission tick); ``lost``: how many lost their estimate at some point while they waited;
- **finish-time fairness** (Themis's rho) per pool: its mean completion time under sharing over its
  mean completion time alone on its fair share, estimated as each job running at once, for its
  duration, stretched by ``gpus / fair share GPUs`` when it asks for more than the share; so rho
  is 1 for a pool never kept waiting, and larger the longer sharing kept it waiting.
"""

from __future__ import annotations

import math
from bisect import bisect_right
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from corral.domain import pools as pool_rules
from corral.sim.engine import Record
from corral.sim.workload import Scenario, WorkloadJob


def percentiles(values: Sequence[float]) -> dict[str, float | None]:
    """p50/p90/p99 (linear interpolation between closest ranks) and the mean; None when empty."""
    if not values:
        return {"p50": None, "p90": None, "p99": None, "mean": None}
    ordered = sorted(values)

    def at(fraction: float) -> float:
        position = fraction * (len(ordered) - 1)
        low = math.floor(position)
        high = min(low + 1, len(ordered) - 1)
        return ordered[low] + (ordered[high] - ordered[low]) * (position - low)

    return {
        "p50": round(at(0.5), 3),
        "p90": round(at(0.9), 3),
        "p99": round(at(0.99), 3),
        "mean": round(sum(ordered) / len(ordered), 3),
    }


def allocation_series(record: Record, reserved: bool = False) -> list[tuple[float, int]]:
    """(time, GPUs busy from then on), one point per instant where it changed; ``reserved``: the
    GPUs reserved instead."""
    series: list[tuple[float, int]] = []
    held = 0
    for at, _, delta in record.reserved if reserved else record.allocation:
        held += delta
        if series and series[-1][0] == at:
            series[-1] = (at, held)
        else:
            series.append((at, held))
    return series


def mean_allocation(series: Sequence[tuple[float, float]], start: float, end: float, gpus: int) -> float:
    """Time-weighted mean of ``series`` over [start, end], as a fraction of ``gpus``."""
    if end <= start or gpus <= 0 or not series:
        return 0.0
    area = 0.0
    for (at, held), (following, _) in zip(series, [*series[1:], (end, 0)], strict=True):
        low, high = max(at, start), min(following, end)
        if high > low:
            area += held * (high - low)
    return area / (gpus * (end - start))


def fair_shares(scenario: Scenario, pools: Iterable[str]) -> dict[str, float]:
    """Each pool's fraction of the cluster (module docstring)."""
    paths = sorted(set(pools))
    stored = scenario.pools
    guarantees: dict[str, int] = {}
    for path in paths:
        guarantee = stored[path].guarantee if path in stored else None
        guarantees[path] = guarantee.gpus if guarantee is not None else 0
    total = sum(guarantees.values())
    if total > 0:
        return {path: guarantees[path] / total for path in paths}
    weights = {path: (stored[path].weight or 1.0) if path in stored else 1.0 for path in paths}
    whole = sum(weights.values()) or 1.0
    return {path: weights[path] / whole for path in paths}


#: gangs over the bound the summary lists, at most (the longest waits)
MAX_LISTED_GANGS = 100


#: entries of a gang's reservation history the summary keeps (the last ones)
MAX_HISTORY = 12


def estimate_accuracy(record: Record, jobs: Sequence[WorkloadJob], tick_s: float) -> dict[str, Any]:
    """How close the first estimated start of each gang and job came to its actual start (module
    docstring); the gangs' figures apart too."""
    submitted = {job.job_id: job for job in jobs}
    errors: list[float] = []
    fractions: list[float] = []
    gang_errors: list[float] = []
    gang_fractions: list[float] = []
    early = late = lost = 0
    for job_id, history in record.estimates.items():
        if any(start is None for _, start in history):
            lost += 1
        start = record.starts.get(job_id)
        job = submitted.get(job_id)
        first = next((estimate for _, estimate in history if estimate is not None), None)
        if start is None or job is None or first is None:
            continue
        error = abs(start - first)
        errors.append(error)
        wait = start - job.submit_time
        fractions.append(error / wait if wait > 0 else 0.0)
        if job.gang_size > 1:
            gang_errors.append(error)
            gang_fractions.append(fractions[-1])
        if start < first - tick_s:
            early += 1
        elif start > first + tick_s:
            late += 1
    return {
        "jobs": len(errors),
        "error_s": percentiles(errors),
        "error_of_wait": percentiles(fractions),
        "gangs": len(gang_errors),
        "gang_error_s": percentiles(gang_errors),
        "gang_error_of_wait": percentiles(gang_fractions),
        "early": early,
        "late": late,
        "lost": lost,
    }


def peak_gang_load(gangs: Sequence[WorkloadJob], cluster_gpus: int, window_s: float) -> float:
    """The most GPU-seconds gangs submitted within ``window_s`` ask for, over what ``cluster_gpus``
    run in ``window_s`` (module docstring)."""
    if cluster_gpus <= 0 or window_s <= 0 or not gangs:
        return 0.0
    ordered = sorted(gangs, key=lambda job: job.submit_time)
    peak = total = 0.0
    first = 0
    for job in ordered:
        total += job.gpus * job.gang_size * job.duration
        while ordered[first].submit_time < job.submit_time - window_s:
            leaving = ordered[first]
            total -= leaving.gpus * leaving.gang_size * leaving.duration
            first += 1
        peak = max(peak, total)
    return peak / (cluster_gpus * window_s)


def time_below_fair_share(
    gangs: Sequence[WorkloadJob],
    record: Record,
    fair_gpus: Mapping[str, float],
    scenario: Scenario,
    end: float,
    within_share: bool = False,
) -> dict[str, float]:
    """For each gang, the seconds it waited (submission to start, or to ``end`` when it never
    started) while its pool held less than its tolerance times its fair share of the GPUs: the
    time the scheduler owed its pool capacity and did not give it (module docstring).
    ``within_share``: only the time when the pool's GPUs plus the gang's were also at most the
    fair share (the gang itself was owed: ``starved_gangs_within_share``)."""
    timelines: dict[str, list[tuple[float, int]]] = {}
    for at, pool, delta in sorted([*record.allocation, *record.reserved], key=lambda entry: entry[0]):
        timeline = timelines.setdefault(pool, [])
        held = (timeline[-1][1] if timeline else 0) + delta
        if timeline and timeline[-1][0] == at:
            timeline[-1] = (at, held)
        else:
            timeline.append((at, held))
    owed: dict[str, float] = {}
    for job in gangs:
        tolerance = _tolerance(scenario, job.pool)
        share = fair_gpus.get(job.pool, 0.0)
        bound = tolerance * share
        # past this many GPUs held, starting the gang would take its pool beyond its share
        ceiling = share - job.gpus * job.gang_size if within_share else math.inf
        start = record.starts.get(job.job_id, end)
        timeline = timelines.get(job.pool, [])
        index = bisect_right(timeline, (job.submit_time, math.inf)) - 1
        held = timeline[index][1] if index >= 0 else 0
        at, total = job.submit_time, 0.0
        for next_at, next_held in timeline[index + 1 :]:
            if next_at >= start:
                break
            if held < bound and held <= ceiling:
                total += next_at - at
            at, held = next_at, next_held
        if held < bound and held <= ceiling:
            total += max(0.0, start - at)
        owed[job.job_id] = total
    return owed


def _tolerance(scenario: Scenario, path: str) -> float:
    """The pool's starvation tolerance: its own, else the nearest ancestor's, else the setting."""
    for candidate in [path, *reversed(pool_rules.ancestors(path))]:
        pool = scenario.pools.get(candidate)
        if pool is not None and pool.starvation_tolerance is not None:
            return pool.starvation_tolerance
    return scenario.settings.starvation_tolerance


def summarize(
    scenario: Scenario, record: Record, policy: str, elapsed_s: float | None = None
) -> dict[str, Any]:
    jobs = scenario.workload.jobs
    cluster_gpus = scenario.cluster.gpus
    delays: dict[str, float] = {}
    jcts: dict[str, float] = {}
    for job in jobs:
        start = record.starts.get(job.job_id)
        if start is None:
            continue
        delays[job.job_id] = start - job.submit_time
        end = record.ends.get(job.job_id)
        if end is not None:
            jcts[job.job_id] = end - job.submit_time
    first = min((job.submit_time for job in jobs), default=0.0)
    last = max(record.ends.values(), default=first)
    series = allocation_series(record)
    bound = scenario.settings.starvation_bound_s
    lost = sum(entry[4] for entry in record.preemptions) / 3600
    by_pool: dict[str, list[WorkloadJob]] = {}
    for job in jobs:
        by_pool.setdefault(job.pool, []).append(job)
    shares = fair_shares(scenario, by_pool)
    gangs = [job for job in jobs if job.gang_size > 1]
    over_bound = [job.job_id for job in gangs if job.job_id not in delays or delays[job.job_id] > bound]
    share_gpus_of = {path: share * cluster_gpus for path, share in shares.items()}
    owed = time_below_fair_share(gangs, record, share_gpus_of, scenario, last)
    owed_start = time_below_fair_share(gangs, record, share_gpus_of, scenario, last, within_share=True)
    starved = [job.job_id for job in gangs if owed[job.job_id] > bound]
    within = {job.job_id for job in gangs if owed_start[job.job_id] > bound}
    starved_set, over_set = set(starved), set(over_bound)
    makespan = last - first
    pools: dict[str, Any] = {}
    for path, members in sorted(by_pool.items(), key=lambda item: pool_rules.tree_order(item[0])):
        share_gpus = shares[path] * cluster_gpus
        used = sum(job.gpus * job.gang_size * job.duration for job in members if job.job_id in record.ends)
        shared = [jcts[job.job_id] for job in members if job.job_id in jcts]
        alone = [
            job.duration * max(1.0, job.gpus * job.gang_size / share_gpus) if share_gpus > 0 else math.inf
            for job in members
            if job.job_id in jcts
        ]
        rho = (sum(shared) / sum(alone)) if shared and sum(alone) > 0 and math.isfinite(sum(alone)) else None
        pools[path] = {
            "jobs": len(members),
            "queue_delay_s": percentiles([delays[job.job_id] for job in members if job.job_id in delays]),
            "jct_s": percentiles(shared),
            "gpu_hours": round(used / 3600, 3),
            "demand_gpu_hours": round(sum(j.gpus * j.gang_size * j.duration for j in members) / 3600, 3),
            "fair_share": round(shares[path], 4),
            "fair_share_gpu_hours": round(shares[path] * cluster_gpus * makespan / 3600, 3),
            "preemptions": sum(1 for entry in record.preemptions if entry[2] == path),
            "rho": None if rho is None else round(rho, 3),
            "starved_gangs": sum(1 for job in members if job.job_id in starved_set),
            "starved_gangs_within_share": sum(1 for job in members if job.job_id in within),
            "gangs_over_bound": sum(1 for job in members if job.job_id in over_set),
            "unfinished": sum(1 for job in members if job.job_id not in jcts),
        }
    arrivals = max((job.submit_time for job in jobs), default=first) - first or makespan
    light = [
        path
        for path, figures in pools.items()
        if figures["demand_gpu_hours"] <= figures["fair_share"] * cluster_gpus * arrivals / 3600
    ]
    summary: dict[str, Any] = {
        "policy": policy,
        "workload": scenario.workload.name,
        "cluster": {
            "name": scenario.cluster.name,
            "workers": len(scenario.cluster.workers),
            "gpus": cluster_gpus,
        },
        "jobs": len(jobs),
        "finished": len(jcts),
        "unfinished": len(jobs) - len(jcts),
        "makespan_s": round(makespan, 3),
        "queue_delay_s": percentiles(list(delays.values())),
        "jct_s": percentiles(list(jcts.values())),
        "gpu_allocation": round(mean_allocation(series, first, last, cluster_gpus), 4),
        "gpu_reserved": round(
            mean_allocation(allocation_series(record, reserved=True), first, last, cluster_gpus), 4
        ),
        "preemptions": len(record.preemptions),
        "gpu_hours_lost": round(lost, 3),
        "starved_gangs": len(starved),
        "starved_gangs_within_share": len(within),
        "gangs_over_bound": len(over_bound),
        "starvation_bound_s": bound,
        "peak_gang_load": round(peak_gang_load(gangs, cluster_gpus, bound), 3),
        # the gangs over the bound, longest wait first (the report's table)
        "gangs": [
            {
                "job_id": job.job_id,
                "pool": job.pool,
                "gang_size": job.gang_size,
                "gpus": job.gpus,
                "submit_time": job.submit_time,
                "queue_delay_s": delays.get(job.job_id),
                "below_fair_share_s": round(owed[job.job_id], 3),
                "starved": job.job_id in starved_set,
                "owed_start_s": round(owed_start[job.job_id], 3),
                "starved_within_share": job.job_id in within,
                # (time, estimated start or None), as the cycles changed it, at most the last few
                "reservations": [
                    [round(at, 3), None if start is None else round(start, 3)]
                    for at, start in record.estimates.get(job.job_id, [])[-MAX_HISTORY:]
                ],
                "reservation_changes": len(record.estimates.get(job.job_id, [])),
            }
            for job in sorted(
                (job for job in gangs if job.job_id in over_set),
                key=lambda job: (-delays.get(job.job_id, math.inf), job.job_id),
            )[:MAX_LISTED_GANGS]
        ],
        "estimated_start": estimate_accuracy(record, jobs, scenario.settings.admission_tick_s),
        "pools": pools,
        # pools that asked for no more than their fair share over the makespan, and the others
        "light_pools": _group(light, by_pool, delays),
        "heavy_pools": _group([path for path in pools if path not in light], by_pool, delays),
        "engine": {
            "events": record.events,
            "admission_cycles": record.cycles,
            "cycles_skipped": record.cycles_skipped,
        },
    }
    if elapsed_s is not None:
        summary["engine"]["wall_s"] = round(elapsed_s, 3)
    spread = gang_spread(scenario, record)
    if spread is not None:
        summary["gang_spread"] = spread
    production = production_figures(scenario)
    if production is not None:
        summary["production"] = production
    if scenario.workload.unscheduled:
        summary["unscheduled_in_production"] = len(scenario.workload.unscheduled)
    return summary


def _group(
    paths: Sequence[str], by_pool: Mapping[str, Sequence[WorkloadJob]], delays: Mapping[str, float]
) -> dict[str, Any]:
    waited = [delays[job.job_id] for path in paths for job in by_pool[path] if job.job_id in delays]
    return {"pools": list(paths), "queue_delay_s": percentiles(waited)}


def production_figures(scenario: Scenario) -> dict[str, Any] | None:
    """The trace's own figures on the same jobs (where it has them): queueing delay, and the GPU
    allocation of its starts and durations over its own makespan on the same nodes."""
    jobs = [job for job in scenario.workload.jobs if job.production_start is not None]
    if not jobs:
        return None
    changes: dict[float, int] = {}
    for job in jobs:
        start = job.production_start or 0.0
        changes[start] = changes.get(start, 0) + job.gpus * job.gang_size
        end = start + job.duration
        changes[end] = changes.get(end, 0) - job.gpus * job.gang_size
    series: list[tuple[float, int]] = []
    held = 0
    for at in sorted(changes):
        held += changes[at]
        series.append((at, held))
    first = min(job.submit_time for job in jobs)
    last = max((job.production_start or 0.0) + job.duration for job in jobs)
    return {
        "queue_delay_s": percentiles([(job.production_start or 0.0) - job.submit_time for job in jobs]),
        "gpu_allocation": round(mean_allocation(series, first, last, scenario.cluster.gpus), 4),
        "makespan_s": round(last - first, 3),
    }


def production_series(scenario: Scenario) -> list[tuple[float, int]]:
    changes: dict[float, int] = {}
    for job in scenario.workload.jobs:
        if job.production_start is None:
            continue
        changes[job.production_start] = changes.get(job.production_start, 0) + job.gpus * job.gang_size
        end = job.production_start + job.duration
        changes[end] = changes.get(end, 0) - job.gpus * job.gang_size
    series: list[tuple[float, int]] = []
    held = 0
    for at in sorted(changes):
        held += changes[at]
        series.append((at, held))
    return series


def delays_of(scenario: Scenario, record: Record, pools: Mapping[str, bool] | None = None) -> list[float]:
    return [
        record.starts[job.job_id] - job.submit_time
        for job in scenario.workload.jobs
        if job.job_id in record.starts and (pools is None or job.pool in pools)
    ]


def gang_spread(scenario: Scenario, record: Record) -> dict[str, Any] | None:
    """How many racks and blocks each gang's first start spanned (issue 25), against the fewest
    racks its hosts could fit in (its host count over the largest rack's hosts, rounded up); None
    on a cluster without rack labels. ``ratio``: the mean racks spanned over the mean fewest."""
    racks = {worker.id: worker.labels.get("topology.rack") for worker in scenario.cluster.workers}
    if not any(racks.values()):
        return None
    blocks = {worker.id: worker.labels.get("topology.block") for worker in scenario.cluster.workers}
    per_rack: dict[str, int] = {}
    for rack in racks.values():
        if rack is not None:
            per_rack[rack] = per_rack.get(rack, 0) + 1
    hosts_per_rack = max(per_rack.values())
    asks = {job.job_id: job.topology for job in scenario.workload.jobs}
    gangs: list[dict[str, Any]] = []
    for job_id, workers in sorted(record.gang_workers.items()):
        hosts = set(workers)
        gangs.append(
            {
                "job_id": job_id,
                "tasks": len(workers),
                "hosts": len(hosts),
                "racks": len({racks[worker] or worker for worker in hosts}),
                "blocks": len({blocks[worker] or worker for worker in hosts}),
                "fewest_racks": math.ceil(len(hosts) / hosts_per_rack),
                "required_rack": asks.get(job_id) == ("required", "topology.rack"),
            }
        )
    if not gangs:
        return {"gangs": 0}
    by_size: dict[int, list[dict[str, Any]]] = {}
    for gang in gangs:
        by_size.setdefault(gang["hosts"], []).append(gang)

    def means(members: Sequence[dict[str, Any]]) -> dict[str, Any]:
        racks_mean = sum(gang["racks"] for gang in members) / len(members)
        fewest = sum(gang["fewest_racks"] for gang in members) / len(members)
        return {
            "gangs": len(members),
            "mean_racks": round(racks_mean, 3),
            "mean_fewest_racks": round(fewest, 3),
            "ratio": round(racks_mean / fewest, 3) if fewest else None,
            "mean_blocks": round(sum(gang["blocks"] for gang in members) / len(members), 3),
        }

    multi_host = [gang for gang in gangs if gang["hosts"] >= 2]
    required = [gang for gang in gangs if gang["required_rack"]]
    return {
        **means(gangs),
        "multi_host": means(multi_host) if multi_host else None,
        "by_hosts": {str(hosts): means(members) for hosts, members in sorted(by_size.items())},
        "required_rack_gangs": len(required),
        "required_rack_split": sum(1 for gang in required if gang["racks"] > 1),
        "per_gang": [[gang["hosts"], gang["racks"], gang["blocks"]] for gang in gangs],
    }
