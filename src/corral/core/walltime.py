"""A submitted job's time limit (API.md "Time limits"): its pool's default when it sets none, and
no more than its pool's maximum. Pure: the server's submit and the simulator call it.

``walltime_s`` is a limit the worker enforces (``corral.worker.walltime``): the attempt is ended
at it, failed with reason ``walltime_exceeded`` and not retried. A pool (and so its subtree, the
settings being inherited down the tree, ``corral.domain.pools``) may give the jobs that set none a
``default_walltime_s`` and refuse a ``walltime_s`` above its ``max_walltime_s``; the server's
``CORRAL_DEFAULT_WALLTIME_S`` and ``CORRAL_MAX_WALLTIME_S`` are the root's. What a job gets is
written into its spec at submit, so every reader (the worker, the planner's deadlines, the job
object) sees the one limit that holds, and a later change of the pool changes no job already
submitted.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace

from corral.domain import errors
from corral.domain.pools import Pool, PoolDefaults, effective
from corral.domain.records import JobSpec

__all__ = ["limited", "limited_all"]


def limited(spec: JobSpec, pool: Pool, field: str = "walltime_s") -> JobSpec:
    """``spec`` under ``pool``'s rules: with the pool's default when it sets no ``walltime_s`` (at
    most the pool's maximum, where an inherited default and a maximum cross); 400 naming
    ``field`` when it asks for more than the maximum."""
    most = pool.max_walltime_s
    if spec.walltime_s is None:
        default = pool.default_walltime_s
        if default is None:
            return spec
        return replace(spec, walltime_s=default if most is None else min(default, most))
    if most is not None and spec.walltime_s > most:
        raise errors.InvalidRequest(
            f"{field}: {spec.walltime_s:g} s is above the maximum of pool {pool.path} ({most:g} s)",
            field=field,
        )
    return spec


def limited_all(
    specs: Sequence[JobSpec], pools: Mapping[str, Pool], defaults: PoolDefaults, batch: bool
) -> list[JobSpec]:
    """Every spec of a submit under its own pool's rules (``limited``); a batch's error names the
    index of the first job refused (``jobs.3.walltime_s``)."""
    return [
        limited(
            spec, effective(spec.pool, pools, defaults), f"jobs.{index}.walltime_s" if batch else "walltime_s"
        )
        for index, spec in enumerate(specs)
    ]
