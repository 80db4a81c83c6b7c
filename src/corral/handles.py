"""Handles on submitted work: what ``Client.submit`` returns (``corral.client``).

A handle names a job, a gang or an array and speaks to the server for it: ``wait`` until it ends,
its output as lines (``logs``, live with ``follow=True``), ``cancel``, and a fresh read of it
(``refresh``, ``status``, ``why``, ``events``). The three kinds answer the same calls, so a script
that submits "a job or a gang" needs no branch; ``tasks`` is a gang's ranks or an array's tasks as
job handles (a job's own is itself). A handle holds nothing but ids: every property that says
something about the job reads it from the server, and two handles on the same id are the same.

The examples below run against a real server and worker (``tests/e2e/test_sdk_examples.py`` runs
every one), with ``corral`` a connected ``corral.client.Client``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from corral import log_lines
from corral.client_errors import ClientError, WaitTimeout

if TYPE_CHECKING:
    from corral.connection import LogChunk
    from corral.protocol.answers import (
        ArrayAnswer,
        EventAnswer,
        GangAnswer,
        JobAnswer,
        ReasonAnswer,
        WhyAnswer,
    )

__all__ = ["ArrayHandle", "GangHandle", "Handle", "JobHandle", "WaitTimeout"]

AnswerT = TypeVar("AnswerT")

#: a job, gang task or array task in one of these has ended for good
ENDED = frozenset({"done", "failed", "cancelled"})
#: the first pause between two looks of ``wait``; each next one is longer, up to ``_MAX_POLL_S``
_FIRST_POLL_S = 0.1
_MAX_POLL_S = 2.0
#: how often a followed output is read again when nothing new came
FOLLOW_POLL_S = 0.5


class Calls(Protocol):
    """The calls of ``corral.client.Client`` a handle makes (named here so that this module does
    not import the client, which imports it)."""

    def get_job(self, job_id: str) -> JobAnswer: ...
    def cancel(self, job_id: str) -> JobAnswer: ...
    def why(self, job_id: str) -> WhyAnswer: ...
    def events(self, job_id: str) -> list[EventAnswer]: ...
    def logs(self, job_id: str, attempt: int | None = None, offset: int = 0) -> LogChunk: ...
    def gang(self, gang_id: str) -> GangAnswer: ...
    def cancel_gang(self, gang_id: str) -> GangAnswer: ...
    def gang_why(self, gang_id: str) -> WhyAnswer: ...
    def gang_events(self, gang_id: str) -> list[EventAnswer]: ...
    def array(self, array_id: str, limit: int = 100) -> ArrayAnswer: ...
    def cancel_array(self, array_id: str) -> ArrayAnswer: ...
    def iter_jobs(self, page_size: int = 500, **filters: Any) -> Iterator[JobAnswer]: ...


class Handle:
    """What the three handles share: the id, equality by id, and ``wait``'s polling."""

    kind = "job"

    def __init__(self, client: Calls, handle_id: str) -> None:
        self._client = client
        #: the job's (``j-…``), gang's (``g-…``) or array's (``a-…``) id
        self.id = handle_id

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.id!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Handle) and type(other) is type(self) and other.id == self.id

    def __hash__(self) -> int:
        return hash((type(self).__name__, self.id))

    def _ended(self, answer: Any) -> bool:
        raise NotImplementedError

    def _status(self, answer: Any) -> str:
        raise NotImplementedError

    def _why_waiting(self, answer: Any) -> str:
        """What a ``WaitTimeout``'s message says of why it still waits ("" when nothing)."""
        return ""

    def _poll(self, read: Callable[[], AnswerT], timeout: float | None, poll_s: float | None) -> AnswerT:
        """``read()`` until its answer has ended; ``WaitTimeout`` past ``timeout`` seconds. The
        pause between looks starts short (a job that ends at once is seen at once) and grows to
        ``_MAX_POLL_S``, unless ``poll_s`` fixes it."""
        give_up = None if timeout is None else time.monotonic() + timeout
        pause = poll_s or _FIRST_POLL_S
        while True:
            answer = read()
            if self._ended(answer):
                return answer
            if give_up is not None and time.monotonic() >= give_up:
                what, status, why = f"{self.kind} {self.id}", self._status(answer), self._why_waiting(answer)
                raise WaitTimeout(what, timeout or 0.0, status, answer, why)
            sleep = pause if give_up is None else min(pause, max(0.0, give_up - time.monotonic()))
            time.sleep(sleep)
            pause = poll_s or min(pause * 1.5, _MAX_POLL_S)


class JobHandle(Handle):
    """One job. ``client.submit("echo hello")`` returns one; ``client.handle("j-…")`` makes one
    for a job submitted elsewhere.

    >>> job = corral.submit("echo hello; echo world")
    >>> job.wait(timeout=60).status
    'done'
    >>> list(job.logs())
    ['hello', 'world']
    """

    kind = "job"

    def __init__(self, client: Calls, job_id: str) -> None:
        super().__init__(client, job_id)

    def refresh(self) -> JobAnswer:
        """The job as the server has it now (``GET /jobs/{id}``): every field of API.md's job
        object, typed.

        >>> job = corral.submit("true", name="quick")
        >>> job.refresh().name
        'quick'
        """
        return self._client.get_job(self.id)

    @property
    def status(self) -> str:
        """The job's status now (one request): ``pending``, ``running``, ``done``...

        >>> job = corral.submit("true")
        >>> job.wait(timeout=60).status == job.status == "done"
        True
        """
        return self.refresh().status

    @property
    def tasks(self) -> list[JobHandle]:
        """The job itself, so that a job, a gang and an array can be walked alike.

        >>> job = corral.submit("true")
        >>> job.tasks == [job]
        True
        """
        return [self]

    def wait(self, timeout: float | None = None, poll_s: float | None = None) -> JobAnswer:
        """Wait until the job has ended (``done``, ``failed`` or ``cancelled``) and return it as it
        ended; ``timeout`` (seconds; None: for as long as it takes) past, raise ``WaitTimeout``,
        whose message says its status and why it waits (e.g. ``unschedulable``: no worker could
        ever hold it). The job goes on whatever ``wait`` does. ``poll_s``: a fixed pause between
        two looks (by default from 0.1 s growing to 2 s).

        >>> job = corral.submit("exit 3", max_retries=1)
        >>> ended = job.wait(timeout=60)
        >>> ended.status, ended.exit_code
        ('failed', 3)
        >>> corral.submit("true", gpus=64).wait(timeout=0.5)
        Traceback (most recent call last):
        ...
        corral.client_errors.WaitTimeout: job j-... has not ended after 0.5 s (status pending: ...)
        """
        return self._poll(self.refresh, timeout, poll_s)

    def _ended(self, answer: JobAnswer) -> bool:
        return answer.status in ENDED

    def _status(self, answer: JobAnswer) -> str:
        return answer.status

    def _why_waiting(self, answer: JobAnswer) -> str:
        return _first_reason(self.why, answer.reason)

    def logs(self, follow: bool = False, attempt: int | None = None) -> Iterator[str]:
        """The job's output (stdout and stderr, as written) as lines, without their newline: what
        is stored so far of the attempt (``attempt``, else the latest), or with ``follow`` each
        line as it is written until the attempt ends (a job not started yet is waited for). Lazy:
        each line is read when the loop asks for it, so a follow can be left at any point.

        >>> job = corral.submit("for i in 1 2 3; do echo line $i; sleep 0.1; done")
        >>> for line in job.logs(follow=True):
        ...     print(line)
        line 1
        line 2
        line 3
        """

        def read_tasks() -> list[tuple[JobAnswer, str]]:
            return [(self._client.get_job(self.id), "")]

        return log_lines.lines(read_tasks, self._client.logs, attempt, follow, FOLLOW_POLL_S)

    def cancel(self) -> JobAnswer:
        """Cancel the job: a waiting one is ``cancelled`` at once, a running one is stopped on its
        worker (SIGTERM, the grace, SIGKILL) and ends ``cancelled``; a gang task cancels its whole
        gang. ``ApiError`` 409 ``already_terminal`` when it had ended.

        >>> job = corral.submit("sleep 600")
        >>> job.cancel().id == job.id
        True
        >>> job.wait(timeout=60).status
        'cancelled'
        """
        return self._client.cancel(self.id)

    def why(self) -> WhyAnswer:
        """Why the job is not running, or why it ended: its status and coded reasons.

        >>> corral.submit("true", gpus=64).why().reasons[0].code
        'unschedulable'
        """
        return self._client.why(self.id)

    def events(self) -> list[EventAnswer]:
        """The job's history, oldest first: each change of status, when, and why.

        >>> job = corral.submit("true", gpus=64)  # more than any worker has: it stays pending
        >>> [event.to for event in job.events()]
        ['pending']
        """
        return self._client.events(self.id)


class GangHandle(Handle):
    """A gang: tasks that start together, one per rank (``client.submit(..., gang_size=N)``).

    >>> gang = corral.submit('echo "hello from $RANK of $WORLD_SIZE"', gang_size=2)
    >>> [task.id for task in gang.tasks] == [job.id for job in gang.refresh().tasks]
    True
    >>> gang.wait(timeout=60).status
    'done'
    >>> list(gang.logs())
    ['[rank 0] hello from 0 of 2', '[rank 1] hello from 1 of 2']
    """

    kind = "gang"

    def __init__(self, client: Calls, gang_id: str, task_ids: list[str] | None = None) -> None:
        super().__init__(client, gang_id)
        self._task_ids = task_ids

    def refresh(self) -> GangAnswer:
        """The gang now: its size, its status (derived from its tasks) and every task's job.

        >>> gang = corral.submit("true", gang_size=2)
        >>> gang.refresh().size
        2
        """
        return self._client.gang(self.id)

    @property
    def status(self) -> str:
        """The gang's status now: ``blocked`` while it waits to start whole, ``running``,
        ``preempting`` (draining), ``done``, ``failed``, ``cancelled``.

        >>> corral.submit("true", gang_size=2, gpus=64).status
        'blocked'
        """
        return self.refresh().status

    @property
    def tasks(self) -> list[JobHandle]:
        """A handle per task, by rank (``gang_index``).

        >>> gang = corral.submit("true", gang_size=2)
        >>> [task.refresh().gang_index for task in gang.tasks]
        [0, 1]
        """
        if self._task_ids is None:
            self._task_ids = [task.id for task in self.refresh().tasks]
        return [JobHandle(self._client, task_id) for task_id in self._task_ids]

    def wait(self, timeout: float | None = None, poll_s: float | None = None) -> GangAnswer:
        """Wait until every task has ended; the gang as it ended (``status`` ``done`` only when
        every rank is). ``timeout`` and ``poll_s`` as for ``JobHandle.wait``.

        >>> gang = corral.submit('[ "$RANK" = 1 ] && exit 1; sleep 600', gang_size=2, max_retries=1)
        >>> gang.wait(timeout=60).status  # rank 1 failed, so rank 0 was stopped
        'failed'
        """
        return self._poll(self.refresh, timeout, poll_s)

    def _ended(self, answer: GangAnswer) -> bool:
        return all(task.status in ENDED for task in answer.tasks)

    def _status(self, answer: GangAnswer) -> str:
        return answer.status

    def _why_waiting(self, answer: GangAnswer) -> str:
        return _first_reason(self.why, None)

    def logs(self, follow: bool = False, attempt: int | None = None) -> Iterator[str]:
        """Every rank's output as lines, each after ``[rank N] ``; ``follow`` and ``attempt`` as for
        ``JobHandle.logs``, each rank followed until its attempt ends. Stored output comes rank by
        rank; followed output as the ranks write it (a rank's line is never cut by another's).

        >>> gang = corral.submit('echo "I am $RANK"', gang_size=2)
        >>> sorted(gang.logs(follow=True))
        ['[rank 0] I am 0', '[rank 1] I am 1']
        """

        def read_tasks() -> list[tuple[JobAnswer, str]]:
            tasks = sorted(self.refresh().tasks, key=lambda task: task.gang_index or 0)
            return [(task, f"[rank {task.gang_index or 0}] ") for task in tasks]

        return log_lines.lines(read_tasks, self._client.logs, attempt, follow, FOLLOW_POLL_S)

    def cancel(self) -> GangAnswer:
        """Cancel every task of the gang (its running ranks are stopped as a job's are).

        >>> gang = corral.submit("sleep 600", gang_size=2)
        >>> gang.cancel().gang_id == gang.id
        True
        >>> gang.wait(timeout=60).status
        'cancelled'
        """
        return self._client.cancel_gang(self.id)

    def why(self) -> WhyAnswer:
        """The gang's status and the reasons of its most telling task (named by ``job_id``).

        >>> corral.submit("true", gang_size=2, gpus=64).why().status
        'blocked'
        """
        return self._client.gang_why(self.id)

    def events(self) -> list[EventAnswer]:
        """Every task's history in time order, each event naming its task (``job_id``).

        >>> gang = corral.submit("true", gang_size=2, gpus=64)
        >>> sorted(event["job_id"] for event in gang.events()) == sorted(task.id for task in gang.tasks)
        True
        """
        return self._client.gang_events(self.id)


class ArrayHandle(Handle):
    """An array: one job per index (``client.submit(..., array="0-9%2")``), each with
    ``CORRAL_ARRAY_INDEX`` in its environment.

    >>> array = corral.submit("echo task $CORRAL_ARRAY_INDEX", array="0-2")
    >>> len(array.tasks)
    3
    >>> array.wait(timeout=60).counts
    {'done': 3}
    >>> list(array.logs())
    ['[index 0] task 0', '[index 1] task 1', '[index 2] task 2']
    """

    kind = "array"

    def __init__(self, client: Calls, array_id: str, task_ids: list[str] | None = None) -> None:
        super().__init__(client, array_id)
        self._task_ids = task_ids

    def refresh(self, limit: int = 0) -> ArrayAnswer:
        """The array now: its size, throttle and its tasks' counts by status, with its first
        ``limit`` tasks by index.

        >>> array = corral.submit("true", array="0-4%2")
        >>> answer = array.refresh()
        >>> answer.size, answer.throttle
        (5, 2)
        """
        return self._client.array(self.id, limit=limit)

    @property
    def counts(self) -> dict[str, int]:
        """How many tasks are in each status now, e.g. ``{"done": 7, "running": 2, "pending": 1}``.

        >>> corral.submit("true", array="0-2", gpus=64).counts
        {'pending': 3}
        """
        return dict(self.refresh().counts)

    @property
    def status(self) -> str:
        """One word for the array now, by the rule a gang's status follows: ``failed`` once a task
        failed, ``done`` when every task is, ``cancelled`` when all ended otherwise, ``running``
        while any runs, else ``pending``.

        >>> array = corral.submit("exit $CORRAL_ARRAY_INDEX", array="0-1", max_retries=1)
        >>> array.wait(timeout=60).counts == {"done": 1, "failed": 1}
        True
        >>> array.status
        'failed'
        """
        return _array_status(self.refresh().counts)

    @property
    def tasks(self) -> list[JobHandle]:
        """A handle per task, by index.

        >>> [task.refresh().array_index for task in corral.submit("true", array="3-5").tasks]
        [3, 4, 5]
        """
        if self._task_ids is None:
            jobs = sorted(self._client.iter_jobs(array_id=self.id), key=lambda job: job.array_index or 0)
            self._task_ids = [job.id for job in jobs]
        return [JobHandle(self._client, task_id) for task_id in self._task_ids]

    def wait(self, timeout: float | None = None, poll_s: float | None = None) -> ArrayAnswer:
        """Wait until every task has ended; the array's counts by status then. ``timeout`` and
        ``poll_s`` as for ``JobHandle.wait``.

        >>> corral.submit("true", array="0-9%5").wait(timeout=60).counts
        {'done': 10}
        """
        return self._poll(self.refresh, timeout, poll_s)

    def _ended(self, answer: ArrayAnswer) -> bool:
        return all(status in ENDED for status in answer.counts)

    def _status(self, answer: ArrayAnswer) -> str:
        return ", ".join(f"{count} {status}" for status, count in sorted(answer.counts.items()))

    def logs(self, follow: bool = False, attempt: int | None = None) -> Iterator[str]:
        """Every task's output as lines, each after ``[index N] `` (its ``array_index``);
        ``follow`` and ``attempt`` as for ``JobHandle.logs``. Each round reads the array's tasks
        in pages of 500 (``GET /jobs?array_id=``), then the output of those that started.

        >>> array = corral.submit("echo $((CORRAL_ARRAY_INDEX * 10))", array="1-2")
        >>> sorted(array.logs(follow=True))
        ['[index 1] 10', '[index 2] 20']
        """

        def read_tasks() -> list[tuple[JobAnswer, str]]:
            jobs = sorted(self._client.iter_jobs(array_id=self.id), key=lambda job: job.array_index or 0)
            return [(job, f"[index {job.array_index}] ") for job in jobs]

        return log_lines.lines(read_tasks, self._client.logs, attempt, follow, FOLLOW_POLL_S)

    def cancel(self) -> ArrayAnswer:
        """Cancel every task of the array that has not ended (owner or admin); its counts after.

        >>> array = corral.submit("sleep 600", array="0-3")
        >>> array.cancel().array_id == array.id
        True
        >>> array.wait(timeout=60).counts
        {'cancelled': 4}
        """
        return self._client.cancel_array(self.id)


def _array_status(counts: dict[str, int]) -> str:
    statuses = {status for status, count in counts.items() if count}
    if "failed" in statuses:
        return "failed"
    if statuses == {"done"}:
        return "done"
    if statuses <= ENDED:
        return "cancelled"
    if statuses & {"running", "preempting"}:
        return "running"
    return "pending"


def _first_reason(why: Callable[[], WhyAnswer], stored: ReasonAnswer | None) -> str:
    """The first reason ``why`` gives (it weighs what the stored reason may not say yet, such as no
    worker ever being able to hold the job), else the stored one when ``why`` cannot be read."""
    try:
        reasons = why().reasons
    except ClientError:
        reasons = []
    reason = reasons[0] if reasons else stored
    return f"{reason.code}: {reason.message}" if reason is not None else ""
