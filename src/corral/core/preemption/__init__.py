"""The preemption planner (seed 003, with DESIGN.md's "Preemption: corral's choices"): which running
work to stop so that higher work that cannot be placed can run, and nothing more.

``plan(inputs)`` is pure: the cycle's snapshot in (after the regular placement of the admission
cycle), decisions out. It runs inside the admission cycle, over the whole cluster at once, not per
heartbeat, so it sees every candidate victim and every waiting preemptor together.

**Preemptors**, in order (class highest first, then priority, then the queue order): the blocked
gangs the regular placement could not place, and the pending single jobs that fit no worker's free
capacity. A preemptor that fits somewhere without anyone stopping is left to the claim or to the
next cycle: preemption is a last resort.

**Victims** come in units: a single job, or a whole gang (every task it has running or reserved;
a gang is never sliced). A unit may be taken from preemptor P (class N, pool Q) when:

- ``priority``: its class is < N; or ``reclaim``: Q is below its guarantee with P's request added,
  and the unit runs on capacity its own pool borrows (beyond its pool's guarantee), class <= N;
- ``fair_share``: Q (or an ancestor) is starving, the unit's class is N and its pool may give it
  up (seed 002's preemptible groups; aggressively preemptible ones in the aggressive stage);
- nothing protects it (``corral.core.protection.why_protected``: class 10, a ``sensitive`` pool,
  ``checkpoint: none`` with class >= 7, within ``near_completion_s`` of its declared walltime), it
  is not a ``service`` pool's allocation on the pool's own (guaranteed) capacity, and it is not
  already being stopped;
- its worker is usable and had no preemptive placement within ``backoff_s`` (nor earlier this
  cycle): at most one preemptive placement per worker per backoff.

**Pools over their limits** (seed 002's third trigger: limits lowered below what a subtree runs)
are preempted back under them first, with no preemptor: the minimal set of the subtree's units in
comparator order whose resources cover the excess, reason ``pool_limit`` (``limits``).

**The cost** of a unit, in GPU-seconds lost (``cost``): for a job that checkpoints, its GPUs times
its expected checkpoint time (the median of its past checkpoint phases, else 300 s for ``auto`` and
600 s for ``manual``); otherwise its GPUs times the time since its last checkpoint (or its start);
plus a penalty that grows steeply once 90% of a declared walltime is used. One comparator orders the
units (``victim_key``): class ascending, cost ascending, newest first, id.

**The victim set** of a worker for one task of P: that worker's eligible units in comparator order,
taken until the task fits in the worker's free capacity plus what they free, then put back in
reverse order where the task still fits without them (minimal), at most ``max_victims`` units. P's
tasks are placed first on free capacity, then on the best worker sets (the set's worst class, its
cost, its size, the worker id); a gang preemptor gets room for every task or nobody is touched, and
in all at most ``max_victims`` units. The units are put back once more over the whole set, so no
unit is stopped that P does not need. If no set exists, P waits and its reason says why.

**Speed.** Worker sets are computed once per preemptor shape (class, request, constraints) and only
as far as needed: workers in the order of a lower bound of their best set's key, no further than
the preemptor's class allows, at most ``SEARCH_LIMIT`` sets per preemptor (``bench/admission.py``:
2,000 busy workers, 600 preemptors).

**Room already coming free.** Victims of earlier cycles still stopping hold room that is theirs no
more: a preemptor that fits there is reserved on it without a new victim. A preemptor that fits on
free room is left to the claim (single jobs) or the next cycle, its room set aside in the plan's
books so that no lower preemptor counts on it. Work no preemption could take back is refused room
on borrowed capacity (``corral.core.borrowing``), and tried once more at the end of the plan.

The loop applies each ``Preemption`` in one transaction (``start_preemption``): the victims go
``preempting`` (each with the job or gang it is stopped for, and, when it checkpoints, its checkpoint
phase), and P is reserved on the capacity they hold, with ``victims_deadline``: the claim starts it
once they have left, and its reservation does not expire before then. No lower job slips in while
the victims stop: the worker's books count both the victims and P's reservation.

The modules, by concern: ``corral.core.protection`` (which work is never a victim, shared with the
admission cycle and the claim), ``rules`` (cost, the victim comparator, the preemptors' order, the
triggers a preemptor carries), ``inputs`` (the snapshot and settings), ``units`` (victim units and
their fair-share groups), ``room`` (the workers' free capacity during a plan), ``triggers`` (which
unit may be taken for whom; the pools' books), ``search`` (the victim-set search), ``locality``
(a gang's victims inside the best topology domain), ``planner`` (one preemptor), ``limits`` (pools
over their limits), ``plan`` (the cycle and its stages), ``apply`` (``start_preemption``).
"""

from __future__ import annotations

from corral.core.decisions import Preemption, Victim
from corral.core.preemption.apply import PreemptionStarted, start_preemption
from corral.core.preemption.inputs import PlanInputs, PreemptionSettings, Preemptor
from corral.core.preemption.plan import PreemptionPlan, plan
from corral.core.preemption.rules import HIGH_CLASS, NEVER_PREEMPTED_CLASS, cost, preemptor_key, victim_key
from corral.core.protection import why_protected

__all__ = [
    "HIGH_CLASS",
    "NEVER_PREEMPTED_CLASS",
    "PlanInputs",
    "Preemption",
    "PreemptionPlan",
    "PreemptionSettings",
    "PreemptionStarted",
    "Preemptor",
    "Victim",
    "cost",
    "plan",
    "preemptor_key",
    "start_preemption",
    "victim_key",
    "why_protected",
]
