"""What the preemption planner decides on: its settings, the preemptors, and the cycle's snapshot
(``PlanInputs``)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from corral.core import fairshare
from corral.core.preemption.memo import PlannerMemo
from corral.core.snapshot import PoolView
from corral.domain.records import Allocation, Job, Worker

__all__ = ["PlanInputs", "PreemptionSettings", "Preemptor", "pool_kind"]


@dataclass(frozen=True, slots=True)
class PreemptionSettings:
    max_victims: int = 3
    near_completion_s: float = 300.0
    #: a gang that started less than this long ago is not a victim (``protection.why_protected``;
    #: ``CORRAL_GANG_PREEMPT_EXEMPT_S``, 0 by default: no exemption)
    gang_exempt_s: float = 0.0
    backoff_s: float = 5.0
    #: how long the victims may take to leave: a checkpoint phase (its timeout, the 50% extension,
    #: the deferrals) and then the stop, which is force-drained after ``preempt_timeout_s``
    checkpoint_timeout_s: float = 600.0
    max_deferral_s: float = 300.0
    preempt_timeout_s: float = 45.0
    #: preemptions one cycle decides, at most: a cluster rebalancing at once is spread over a few
    #: cycles (each cycle's time grows with its preemptions), not stopped in one storm
    max_preemptions_per_cycle: int = 128
    #: fair share's prefix rule (``corral.core.fairshare.preemptible_groups``)
    satisfaction_threshold: float = 1.0
    aggressive_satisfaction_threshold: float = 0.2

    def victims_leave_within(self, checkpointing: bool) -> float:
        """The longest the victims of one preemption can hold their capacity."""
        phase = self.checkpoint_timeout_s * 1.5 + self.max_deferral_s if checkpointing else 0.0
        return phase + self.preempt_timeout_s


@dataclass(frozen=True, slots=True)
class Preemptor:
    """Work waiting to be placed: a pending single job (``key`` its id) or a blocked gang (``key``
    its gang id, ``tasks`` in ``gang_index`` order)."""

    key: str
    tasks: tuple[Job, ...]

    @property
    def first(self) -> Job:
        return self.tasks[0]


@dataclass(frozen=True, slots=True)
class PlanInputs:
    """The planner's snapshot. ``holding``: every job holding resources (reserved, running,
    preempting), with this cycle's new reservations as ``extra`` allocations; ``pools`` by path
    (a path not there: kind ``batch``, no guarantee); ``last_preemptive``: worker id -> when it
    last had a preemptive placement (the backoff)."""

    now: float
    workers: tuple[Worker, ...]
    holding: tuple[Job, ...]
    preemptors: tuple[Preemptor, ...]
    settings: PreemptionSettings = field(default_factory=PreemptionSettings)
    pools: Mapping[str, PoolView] = field(default_factory=dict)
    extra: tuple[Allocation, ...] = ()
    last_preemptive: Mapping[str, float] = field(default_factory=dict)
    #: the cycle's fair shares and starvation (None: no fair-share trigger)
    fair: fairshare.FairShareState | None = None
    #: the pool of each ``extra`` allocation's job, by job id (their usage counts for fair share)
    extra_pools: Mapping[str, str] = field(default_factory=dict)
    #: what earlier plans counted and built (None: counted and built anew)
    memo: PlannerMemo | None = None
    #: ``CORRAL_TOPOLOGY_LEVELS``, widest first: once a worker carries one of these labels, a gang
    #: preemptor's victims are taken inside the best domain (``locality``); () never
    topology_levels: tuple[str, ...] = ()


def pool_kind(inputs: PlanInputs, path: str) -> str | None:
    """The kind of the pool at ``path`` (None: no such pool, which the planner treats as ``batch``)."""
    pool = inputs.pools.get(path)
    return pool.kind if pool is not None else None
