"""Rows of the ``pools`` table (migration 6) and the pools a submit creates: helpers that take an
open transaction, shared by the submit (``store.sql``) and the pool store (``store.pools``).

An unknown pool named at submit is created (with its ancestors) in the submit's own transaction:
the jobs are accepted, their reason says the pool was created with defaults, and an admin can tune
it afterwards. A submit never fails on a pool path, so scripts need no setup step; the cost is one
indexed read for the request's distinct pool paths, and an insert only for those that are new.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import replace
from typing import Any

from corral.domain.pools import DEFAULT_POOL, PoolKind, PoolMode, PoolSettings, created_reason, with_ancestors
from corral.domain.resources import Resources
from corral.domain.transitions import Submission
from corral.store.rows import Transaction
from corral.store.schema import POOL_COLUMNS

POOL_SELECT = ", ".join(POOL_COLUMNS)
#: the settings columns (all but the path and the two timestamps), in table order
SETTINGS_COLUMNS = tuple(
    column for column in POOL_COLUMNS if column not in ("path", "created_at", "updated_at")
)
#: SQLite allows 32,766 parameters in a statement, PostgreSQL 65,535: stay far under both
_PATHS_PER_READ = 500


def _resources(values: Sequence[Any]) -> Resources | None:
    """Four nullable columns as a guarantee or a limit: NULL in all four is "not set"."""
    return None if all(value is None for value in values) else Resources(*(int(value) for value in values))


def _optional(value: Any, kind: Any) -> Any:
    return None if value is None else kind(value)


def settings_from_row(row: Sequence[Any]) -> PoolSettings:
    """A ``pools`` row (``POOL_SELECT`` order) as the settings it stores."""
    (
        _path, weight, g_gpus, g_vram, g_memory, g_cpus, l_gpus, l_vram, l_memory, l_cpus, mode, kind,
        starvation, aggressive, tolerance, enable_aggressive, allow_aggressive, _created, _updated,
        default_walltime, max_walltime,
    ) = row  # fmt: skip
    return PoolSettings(
        weight=_optional(weight, float),
        guarantee=_resources((g_gpus, g_vram, g_memory, g_cpus)),
        limits=_resources((l_gpus, l_vram, l_memory, l_cpus)),
        mode=_optional(mode, PoolMode),
        kind=_optional(kind, PoolKind),
        starvation_timeout_s=_optional(starvation, float),
        aggressive_starvation_timeout_s=_optional(aggressive, float),
        starvation_tolerance=_optional(tolerance, float),
        enable_aggressive_starvation=_optional(enable_aggressive, bool),
        allow_aggressive_preemption=_optional(allow_aggressive, bool),
        default_walltime_s=_optional(default_walltime, float),
        max_walltime_s=_optional(max_walltime, float),
    )


def settings_values(settings: PoolSettings) -> tuple[Any, ...]:
    """The settings as the values of ``SETTINGS_COLUMNS``."""

    def four(resources: Resources | None) -> tuple[int | None, ...]:
        if resources is None:
            return (None, None, None, None)
        return (resources.gpus, resources.vram_mb, resources.memory_mb, resources.cpus)

    return (
        settings.weight, *four(settings.guarantee), *four(settings.limits),
        _optional(settings.mode, str), _optional(settings.kind, str),
        settings.starvation_timeout_s, settings.aggressive_starvation_timeout_s,
        settings.starvation_tolerance, _optional(settings.enable_aggressive_starvation, int),
        _optional(settings.allow_aggressive_preemption, int),
        settings.default_walltime_s, settings.max_walltime_s,
    )  # fmt: skip


def ensure_pools(tx: Transaction, paths: Iterable[str], now: float) -> set[str]:
    """Create every pool of ``paths`` and every ancestor of one that has no row, with no settings
    (defaults); the paths this call created. One read for the paths (per 500), one insert per new
    pool; ``ON CONFLICT DO NOTHING`` lets two replicas create the same pool at once."""
    wanted = with_ancestors(paths)
    existing: set[str] = set()
    for start in range(0, len(wanted), _PATHS_PER_READ):
        chunk = wanted[start : start + _PATHS_PER_READ]
        rows = tx.execute(f"SELECT path FROM pools WHERE path IN ({', '.join('?' for _ in chunk)})", chunk)
        existing.update(row[0] for row in rows)
    created = set()
    for path in wanted:  # parents first
        if path not in existing and tx.execute(
            "INSERT INTO pools (path, created_at, updated_at) VALUES (?, ?, ?)"
            " ON CONFLICT (path) DO NOTHING RETURNING path",
            (path, now, now),
        ):
            created.add(path)
    return created


def place_in_pools(tx: Transaction, submissions: Sequence[Submission], now: float) -> Sequence[Submission]:
    """Create the pools the submitted jobs name that do not exist yet (``ensure_pools``); the
    submissions, with the reason of each job whose own pool was just created saying so."""
    # ``default`` always has its row (seeded by migration 6, never deleted): most submits read nothing
    named = {job.spec.pool for _, jobs in submissions for job in jobs} - {DEFAULT_POOL}
    created = ensure_pools(tx, named, now) if named else set()
    if not created:
        return submissions
    return tuple(
        (
            gang_id,
            tuple(
                replace(job, reason=created_reason(job.reason, job.spec.pool))
                if job.spec.pool in created
                else job
                for job in jobs
            ),
        )
        for gang_id, jobs in submissions
    )
