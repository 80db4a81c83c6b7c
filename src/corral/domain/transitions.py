"""What the core decides and the store applies: a job's record before and after, and why.

The core never writes: it returns ``Transition`` values inside a ``Plan``. The store applies each one
in the caller's transaction with a compare-and-set on the row's status and ``version``, appends the
event row, and hands back the plan's outcome. A simulator can apply the same values to its own
records (``applied``), so that both run the very rules of ``corral.core.lifecycle``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Generic, TypeVar

from corral.domain.records import Job, Reason

Outcome = TypeVar("Outcome")


@dataclass(frozen=True, slots=True)
class Transition:
    """``before`` becomes ``after``. A status change is checked against the status table and
    recorded as an event (``reason``, ``epoch``) at ``at``; a change of fields alone (a cancel asked
    of a job already stopping, a stored checkpoint) writes no event."""

    before: Job
    after: Job
    at: float
    reason: Reason | None = None
    epoch: int | None = None
    #: the fields of ``Job`` the transition sets (``move`` fills it in): the store writes those
    #: columns only; None: compare the two records to find them
    fields: frozenset[str] | None = None

    @property
    def changes_status(self) -> bool:
        return self.before.status != self.after.status


def move(
    job: Job, at: float, event_reason: Reason | None, event_epoch: int | None = None, /, **fields: Any
) -> Transition:
    """The transition of ``job`` to ``replace(job, **fields)``, recorded with ``event_reason`` and
    ``event_epoch``. A status change bumps the version and, unless ``fields`` names a ``reason``,
    records the event's reason on the row too."""
    if "status" in fields and fields["status"] != job.status:
        fields.setdefault("reason", event_reason)
        fields["version"] = job.version + 1
    return Transition(job, replace(job, **fields), at, event_reason, event_epoch, frozenset(fields))


#: what one item of a submit creates: a gang's id and its tasks, or None and the single job
Submission = tuple[str | None, tuple[Job, ...]]


@dataclass(frozen=True, slots=True)
class Plan(Generic[Outcome]):
    """A decision: the transitions to apply, in order, and what they mean for the caller."""

    transitions: tuple[Transition, ...]
    outcome: Outcome


def applied(jobs: Sequence[Job], transitions: Iterable[Transition]) -> tuple[Job, ...]:
    """``jobs`` as they are once ``transitions`` are applied (same order): the what-if view a rule
    that follows another one decides on (a drain, then its completion, in one plan)."""
    after = {transition.after.id: transition.after for transition in transitions}
    return tuple(after.get(job.id, job) for job in jobs)


@dataclass(frozen=True)
class FencedReport:
    """A report's decision (``decide``, of ``corral.core``) with what its plan is, known without
    the row, for the one case that is nearly every report: a single job (no gang) that is
    ``from_status`` at ``attempt`` on ``worker_id``. There the plan is always one transition
    setting ``fields`` (``Job`` fields, ``status`` among them), recorded at ``at`` with ``reason``,
    and its outcome is ``outcome`` of the job after it.

    Made by ``corral.core.lifecycle.done_report``. A store may settle it in one statement
    guarded by exactly those conditions, without reading the job first (``PostgresJobs``); where
    that statement matches no row (a stale attempt, a job already done, a gang task, an unknown
    job) it decides as for any other decision: the job read, ``decide`` called, its refusal or its
    plan as before. Called, it is ``decide``."""

    decide: Callable[[Job, tuple[Job, ...]], Plan[Any]]
    worker_id: str
    attempt: int
    from_status: str
    fields: Mapping[str, Any]
    at: float
    reason_code: str
    reason_message: str
    outcome: Callable[[Job], Any]

    def __call__(self, job: Job, gang: tuple[Job, ...]) -> Plan[Any]:
        return self.decide(job, gang)
