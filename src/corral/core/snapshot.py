"""The immutable input of a scheduling cycle: what the store holds, read once, plus ``now``.

A loop loads a ``Snapshot``, the core decides on it, the loop applies the decisions through the
store (each one a compare-and-set, so a decision made on a snapshot that has since moved on changes
nothing). The simulator builds snapshots from a trace instead.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol

from corral.core.fairshare import FairShareState
from corral.domain.records import Allocation, Job, Worker
from corral.domain.resources import Resources


class PoolView(Protocol):
    """What the core reads of a pool (``corral.domain.pools.Pool`` provides it)."""

    @property
    def kind(self) -> str: ...

    @property
    def guarantee(self) -> Resources: ...

    @property
    def mode(self) -> str: ...


@dataclass(frozen=True, slots=True)
class Gang:
    """A gang and its tasks, in ``gang_index`` order. Every task shares the spec (resources,
    constraints, class, priority); ``submitted_at`` is the tasks' own."""

    gang_id: str
    tasks: tuple[Job, ...]

    @property
    def size(self) -> int:
        return len(self.tasks)

    @property
    def request(self) -> Resources:
        return self.tasks[0].spec.resources


@dataclass(frozen=True, slots=True)
class Snapshot:
    """Everything a cycle looks at.

    ``allocations`` are all jobs holding resources (reserved, running, preempting), single jobs
    included; ``gangs`` are the gangs with at least one task that is not terminal; ``pending`` the
    pending single jobs (for holds and backfill); ``workers`` every registered worker (the policies
    use the active ones).

    ``pending`` holds the pending single jobs that may preempt (the store reads those whose class is
    at least the lowest running one, in queue order).

    ``expected_ends`` says, by job id, when an allocation is expected to give its resources back:
    ``started_at + walltime_s`` for a job that declared a walltime, ``now + walltime_s`` for one
    reserved but not started yet. A job absent from it has no known end (no walltime). Gang holds
    read it for ``Hold.expected_at``; a preempting allocation counts as ending at ``now`` (it has
    been told to stop) whatever it says.
    """

    now: float
    workers: tuple[Worker, ...]
    allocations: tuple[Allocation, ...]
    gangs: tuple[Gang, ...]
    pending: tuple[Job, ...] = ()
    expected_ends: Mapping[str, float] = field(default_factory=dict)
    #: every job holding resources, whole rows (the preemption planner's victims; reserved single
    #: jobs whose reservation may go stale)
    holding: tuple[Job, ...] = ()
    #: pools by path (``corral.domain.pools``), for the planner's sensitive, service and borrowing rules
    pools: Mapping[str, PoolView] = field(default_factory=dict)
    #: worker id -> when it last had a preemptive placement (the per-worker backoff)
    last_preemptive: Mapping[str, float] = field(default_factory=dict)
    #: this cycle's fair shares and the pools' starvation (None: fair share is not planned)
    fair: FairShareState | None = None
