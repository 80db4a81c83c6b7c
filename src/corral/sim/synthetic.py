"""A multi-tenant workload built from the shared traces: real arrivals and runtimes, real quotas.

``multi_tenant`` takes the Alibaba trace's scheduled GPU jobs (their inter-arrival gaps and
durations, resampled with a seed) and the Helios Venus quotas (one pool per virtual cluster, each
guaranteed its quota's share of the cluster), and makes the shape issue 10 asks for:

1. **Arrivals**: the trace's own gaps between GPU jobs, scaled so that the work offered is
   ``load`` times what the cluster can run over the arrival window (the trace itself is a light
   sample of its cluster: unscaled, nothing ever waits).
2. **Durations**: the trace's, capped at ``max_duration_s`` (48 h; the trace's services run for
   months and would only measure their own length).
3. **Pools**: ``heavy`` pools (the largest quotas) receive ``heavy_share`` of the jobs, far above
   their share of the cluster; the others split the rest in proportion to their quotas.
4. **Gangs**: ``gang_fraction`` of the jobs become gangs of 2, 4, 8 or 16 tasks of 8 GPUs (the
   trace has none; its 8-GPU pods are the model); the other jobs keep their trace size (1, 2, 4 or
   8 whole GPUs).
5. **Classes and checkpoints**: every job class 5 (the light and heavy pools differ by quota, not
   by class); half checkpoint (``auto``), the rest save every ``checkpoint_every_s`` (1 h) on
   their own. ``protected_fraction`` of the single jobs (drawn from a stream of their own, so the
   rest of the workload is the same) are instead class 8 without checkpoints: work no preemption
   could take back, which the claim keeps off borrowed capacity.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from corral.domain.pools import PoolSettings
from corral.domain.resources import Resources
from corral.sim.readers import uniform_cluster
from corral.sim.workload import Cluster, Workload, WorkloadJob

GANG_SIZES = (2, 4, 8, 16)


@dataclass(frozen=True, slots=True)
class Shape:
    jobs: int = 5000
    workers: int = 128
    gpus_per_worker: int = 8
    load: float = 1.2
    heavy: int = 3
    heavy_share: float = 0.7
    gang_fraction: float = 0.04
    max_duration_s: float = 48 * 3600.0
    checkpoint_every_s: float = 3600.0
    protected_fraction: float = 0.0
    #: pools: the Venus quotas; with more pools asked than VCs, the quotas are repeated
    pools: int | None = None


def multi_tenant(
    trace: Workload, quotas: Mapping[str, float], shape: Shape, seed: int
) -> tuple[Workload, Cluster, dict[str, PoolSettings]]:
    generator = random.Random(seed)
    source = sorted(
        (job for job in trace.jobs if job.gpus >= 1 and job.duration > 0), key=lambda job: job.submit_time
    )
    if len(source) < 2:
        raise ValueError("the trace has too few GPU jobs to resample")
    gaps = [later.submit_time - earlier.submit_time for earlier, later in itertools.pairwise(source)]
    cluster = uniform_cluster(shape.workers, shape.gpus_per_worker)
    names = _pool_names(quotas, shape.pools)
    ranked = sorted(names, key=lambda name: (-names[name], name))
    heavy = set(ranked[: shape.heavy])
    light = [name for name in ranked if name not in heavy]
    light_total = sum(names[name] for name in light) or 1.0
    drawn: list[tuple[float, int, str, float]] = []  # (gap, gpus, pool, duration)
    for _ in range(shape.jobs):
        job = generator.choice(source)
        if generator.random() < shape.heavy_share and heavy:
            pool = generator.choice(sorted(heavy))
        else:
            pool = generator.choices(light, [names[name] / light_total for name in light])[0]
        drawn.append((generator.choice(gaps), job.gpus, pool, min(job.duration, shape.max_duration_s)))
    gangs = [generator.random() < shape.gang_fraction for _ in drawn]
    sizes = [generator.choice(GANG_SIZES) for _ in drawn]
    offered = sum(
        duration * (sizes[index] * shape.gpus_per_worker if gangs[index] else gpus)
        for index, (_, gpus, _, duration) in enumerate(drawn)
    )
    window = offered / (shape.load * cluster.gpus)
    raw = sum(gap for gap, _, _, _ in drawn) or 1.0
    scale = window / raw
    protector = random.Random(seed + 1)
    protected = [protector.random() < shape.protected_fraction for _ in drawn]
    jobs: list[WorkloadJob] = []
    now = 0.0
    for index, (gap, gpus, pool, duration) in enumerate(drawn):
        now += gap * scale
        gang = gangs[index]
        if protected[index] and not gang:
            jobs.append(
                WorkloadJob(
                    job_id=f"j{index:06d}",
                    submit_time=round(now, 3),
                    duration=duration,
                    gpus=min(gpus, shape.gpus_per_worker),
                    pool=f"venus/{pool}",
                    preemption_class=8,
                )
            )
            continue
        jobs.append(
            WorkloadJob(
                job_id=f"j{index:06d}",
                submit_time=round(now, 3),
                duration=duration,
                gpus=shape.gpus_per_worker if gang else min(gpus, shape.gpus_per_worker),
                gang_size=sizes[index] if gang else 1,
                pool=f"venus/{pool}",
                checkpoint="auto" if index % 2 == 0 else "none",
                checkpoint_every_s=None if index % 2 == 0 else shape.checkpoint_every_s,
            )
        )
    total = sum(names.values())
    pools = {
        f"venus/{name}": PoolSettings(
            weight=names[name], guarantee=Resources(gpus=int(cluster.gpus * names[name] / total))
        )
        for name in names
    }
    name = f"multi-tenant-{shape.jobs}-seed{seed}"
    return Workload(tuple(jobs), name=name), Cluster(cluster.workers, cluster.name), pools


def _pool_names(quotas: Mapping[str, float], count: int | None) -> dict[str, float]:
    names = sorted(quotas)
    if count is None or count <= len(names):
        chosen: Sequence[str] = names if count is None else names[:count]
        return {name: quotas[name] for name in chosen}
    return {
        f"{names[index % len(names)]}-{index // len(names)}": quotas[names[index % len(names)]]
        for index in range(count)
    }


def heavy_pools(pools: Mapping[str, PoolSettings], count: int) -> list[str]:
    """The ``count`` pools with the largest quotas (the ones ``multi_tenant`` overloads)."""
    return sorted(pools, key=lambda path: (-(pools[path].weight or 0.0), path))[:count]


def write_csv(workload: Workload, path: str) -> None:
    columns = (
        "job_id",
        "submit_time",
        "duration",
        "gpus",
        "gang_size",
        "pool",
        "checkpoint",
        "checkpoint_every_s",
        "walltime",
    )
    with open(path, "w", encoding="utf-8") as handle:
        handle.write(",".join(columns) + "\n")
        for job in workload.jobs:
            every = "" if job.checkpoint_every_s is None else f"{job.checkpoint_every_s:g}"
            limit = "" if job.walltime is None else f"{job.walltime:.10g}"
            handle.write(
                f"{job.job_id},{job.submit_time:g},{job.duration:g},{job.gpus},{job.gang_size},"
                f"{job.pool},{job.checkpoint},{every},{limit}\n"
            )
