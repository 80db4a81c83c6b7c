"""Whether a job's ``after`` conditions hold (API.md "Arrays and dependencies"), and what becomes
of a job waiting on them: the rule the dependency loop applies (``server.loops.dependencies``).

A condition names a job, a gang or an array by id; the store hands in the statuses of its tasks
(one for a job). ``ok`` holds when every task ended ``done``; ``notok`` when every task ended and
one of them did not end ``done``; ``any`` when every task ended. A condition can no longer hold when
``ok`` meets a task that ended otherwise, ``notok`` meets a group whose every task ended done, or
its id names nothing any more (removed by retention: it ended long ago, how is unknown).

Pure: statuses in, a verdict and transitions out.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from enum import StrEnum

from corral.domain.records import Dependency, Job, Reason
from corral.domain.status import TERMINAL, Status
from corral.domain.transitions import Plan, move

WHEN = ("ok", "notok", "any")
WAITING_FOR_DEPENDENCY = Reason("dependency", "waiting for the jobs it runs after")
NEVER_SATISFIED = Reason(
    "dependency_never_satisfied", "a job it runs after ended in a way its condition does not accept"
)
RELEASED = Reason("queued", "waiting for a worker with free capacity")


class Verdict(StrEnum):
    SATISFIED = "satisfied"
    WAITING = "waiting"
    NEVER = "never"


def condition_verdict(when: str, statuses: Sequence[Status]) -> Verdict:
    """One condition, on the statuses of every task of what it names (none: it names nothing)."""
    if not statuses:
        return Verdict.NEVER
    ended = all(status in TERMINAL for status in statuses)
    all_done = all(status == Status.DONE for status in statuses)
    some_not_done = any(status in TERMINAL and status != Status.DONE for status in statuses)
    if when == "ok":
        if some_not_done:
            return Verdict.NEVER
        return Verdict.SATISFIED if all_done else Verdict.WAITING
    if not ended:
        return Verdict.WAITING
    if when == "notok":
        return Verdict.NEVER if all_done else Verdict.SATISFIED
    return Verdict.SATISFIED


def verdict(after: Sequence[Dependency], statuses: Mapping[str, Sequence[Status]]) -> Verdict:
    """Every condition of ``after`` together: never when one can no longer hold, satisfied when
    all hold, else waiting. ``statuses``: each named id's task statuses (missing: names nothing)."""
    verdicts = [condition_verdict(item.when, statuses.get(item.id, ())) for item in after]
    if Verdict.NEVER in verdicts:
        return Verdict.NEVER
    if all(found == Verdict.SATISFIED for found in verdicts):
        return Verdict.SATISFIED
    return Verdict.WAITING


def settle(job: Job, found: Verdict, now: float) -> Plan[Job | None]:
    """What a job waiting on its dependencies becomes: released to the queue (still ``pending``,
    no event: it never left that status), ``cancelled`` with ``dependency_never_satisfied``, or
    left as it is. Nothing for a job no longer waiting (cancelled, or settled by another pass)."""
    if job.status != Status.PENDING or not job.awaiting_dependencies or found == Verdict.WAITING:
        return Plan((), None)
    if found == Verdict.SATISFIED:
        transition = move(job, now, None, awaiting_dependencies=False, reason=RELEASED)
    else:
        transition = move(
            job, now, NEVER_SATISFIED, status=Status.CANCELLED, finished_at=now, awaiting_dependencies=False
        )
    return Plan((transition,), transition.after)
