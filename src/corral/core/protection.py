"""Which work may never be preempted (seed 003, DESIGN.md "Preemption: corral's choices"): the one
protection rule, used by the preemption planner (victims), the admission cycle (gangs on borrowed
capacity) and the claim (single jobs on borrowed capacity).

A job is protected when it is class 10, in a pool of kind ``sensitive``, ``checkpoint: none`` with
class 7 and above (all its progress would be lost), or within ``near_completion_s`` of its enforced
deadline (``Job.deadline_at``: its start plus its ``walltime_s``, which its worker holds it to).
A job with no limit is never near completion; one past its deadline (its worker is stopping it)
is no longer protected: sparing it saves nothing.

A task of a gang is also protected for ``gang_exempt_s`` after it started (or while it has not
started yet: its gang is starting), as Slurm's ``PreemptExemptTime`` exempts work that just
started. Why gangs only: by the cost rule a gang that just started is the cheapest victim there
is (it has done no work to lose), yet stopping it gives away room that took its reservation
hours to gather on many workers at once, and it must gather it all again; a single job re-queued
finds room again on any one worker. In the simulator's multi-tenant workloads, gangs of 16 x 8
GPUs were taken back seconds after they started, for one 8-GPU job, and queued again for hours.
Off by default (``CORRAL_GANG_PREEMPT_EXEMPT_S`` 0): measured there at 600 s, it ended that churn
and raised one seed's allocation, but the gangs were then taken once they had done 10 minutes of
work (more GPU-hours lost on four seeds of five) and no fewer gangs starved (README).

The first three do not depend on time: a job
they protect is *unreclaimable* (no preemption could ever take back the capacity it holds), so it
is not placed on borrowed capacity (``corral.core.borrowing``). The class and borrowing tests,
which depend on the preemptor, belong to the planner (``corral.core.preemption.triggers``).
"""

from __future__ import annotations

from corral.domain.records import Job

__all__ = ["HIGH_CLASS", "NEVER_PREEMPTED_CLASS", "SENSITIVE", "unreclaimable", "why_protected"]

#: class 10 is never preempted (seed 003)
NEVER_PREEMPTED_CLASS = 10
#: ``checkpoint: none`` at or above this class cannot be preempted (all progress would be lost)
HIGH_CLASS = 7
#: the pool kind whose work is never preempted
SENSITIVE = "sensitive"


def why_protected(
    job: Job, pool_kind: str | None, now: float, near_completion_s: float, gang_exempt_s: float = 0.0
) -> str | None:
    """Why ``job`` (of a pool of kind ``pool_kind``; None: not known) may never be a victim, or None
    when it may be; ``gang_exempt_s``: how long a gang's task is exempt after it started (module
    docstring)."""
    static = _static_protection(job, pool_kind)
    if static is not None:
        return static
    started = job.started_at
    if job.gang_id is not None and gang_exempt_s > 0 and (started is None or now - started < gang_exempt_s):
        return f"its gang started less than {gang_exempt_s:g} s ago"
    deadline = job.deadline_at
    if deadline is not None and now <= deadline < now + near_completion_s:
        return f"within {near_completion_s:g} s of its walltime"
    return None


def unreclaimable(job: Job, pool_kind: str | None) -> bool:
    """``why_protected``'s rules that do not depend on time: no preemption could ever take ``job``
    back, so it may not be placed on borrowed capacity."""
    return _static_protection(job, pool_kind) is not None


def _static_protection(job: Job, pool_kind: str | None) -> str | None:
    spec = job.spec
    if spec.preemption_class >= NEVER_PREEMPTED_CLASS:
        return "class 10 is never preempted"
    if pool_kind == SENSITIVE:
        return "a sensitive pool's work is never preempted"
    if spec.checkpoint_mode == "none" and spec.preemption_class >= HIGH_CLASS:
        return "class 7 and above without checkpoints is not preemptible"
    return None
