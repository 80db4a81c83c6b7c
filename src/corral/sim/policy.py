"""The policies a run compares: ``corral`` (the production core as it is) and ``fifo`` (the baseline).

A policy says how the queue is ordered for the claim and whether the admission cycle runs the
preemption planner. Everything else (gang admission, holds, placement, every transition) is the
same core for both, so a difference in the figures is a difference in policy, not in plumbing.

Fair share (issue 9) is not built yet: when ``corral.core`` grows its fair-share planner, it joins
``corral`` here (``Policy.fair_share``) and the engine hands the cycle's snapshot to it; ``fifo``
keeps it off.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from corral.core.ordering import queue_key
from corral.domain.records import Job


def submission_order(job: Job) -> tuple[Any, ...]:
    """FIFO's one comparator: submission time, then id (no class, no priority, no front of queue)."""
    return (job.submitted_at, job.id)


@dataclass(frozen=True, slots=True)
class Policy:
    name: str
    #: the claim's candidate order
    queue_key: Callable[[Job], tuple[Any, ...]]
    #: whether the admission cycle runs the preemption planner
    preemption: bool
    #: the fair-share planner's seam (issue 9): off until the core has one
    fair_share: bool = False


CORRAL = Policy("corral", queue_key, preemption=True)
FIFO = Policy("fifo", submission_order, preemption=False)
POLICIES = {policy.name: policy for policy in (CORRAL, FIFO)}
