"""Group commit: the job reports that arrive in the same turn of the event loop are applied by one
store call, in one transaction (``Store.change_many``), instead of one transaction each.

A report hands its job id and its core decision to ``ReportGroups.change`` and awaits its own
outcome. The first report of a turn schedules the group's flush for the end of the turn (after every
request task that became ready in it has run up to its report); the flush makes one store call, on
the event loop where the store can take it without waiting (``run_short``), and answers each report
with its own outcome or its own error. Inside the group each report is rolled back alone when it
fails; when the group as a whole fails (nothing of it written), each report is applied again on its
own, so that a fault in one never becomes another's answer, and no report is lost or applied twice
(the compare-and-set fence makes a report that did apply refuse a second time). A store that is
busy or unavailable answers every report of the group so (503: the worker sends it again).
"""

from __future__ import annotations

import asyncio
from typing import Any

from corral.domain import errors
from corral.server.state import ServerState, run_short
from corral.store.base import JobDecision

#: a group larger than this is split: one transaction should not hold the write lock for long
MAX_GROUP = 64


class ReportGroups:
    """The reports waiting for this turn's flush, for one server."""

    def __init__(self, state: ServerState) -> None:
        self._state = state
        self._waiting: list[tuple[str, JobDecision[Any], asyncio.Future[Any]]] = []
        self._flushes: set[asyncio.Task[None]] = set()

    async def change(self, job_id: str, decide: JobDecision[Any]) -> Any:
        """``Store.change(job_id, decide)``, applied with the other reports of this turn."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Any] = loop.create_future()
        if not self._waiting:
            loop.call_soon(self._flush)
        self._waiting.append((job_id, decide, future))
        return await future

    def _flush(self) -> None:
        while self._waiting:
            group, self._waiting = self._waiting[:MAX_GROUP], self._waiting[MAX_GROUP:]
            task = asyncio.ensure_future(self._apply(group))
            self._flushes.add(task)
            task.add_done_callback(self._flushes.discard)

    async def _apply(self, group: list[tuple[str, JobDecision[Any], asyncio.Future[Any]]]) -> None:
        state = self._state
        results: list[Any]
        try:
            if len(group) == 1:
                job_id, decide, _ = group[0]
                results = [await run_short(state, state.store.change, job_id, decide)]
            else:
                results = await run_short(state, state.store.change_many, [(j, d) for j, d, _ in group])
        except Exception as failure:
            if len(group) == 1 or isinstance(failure, errors.StoreUnavailable):
                # the store itself is busy or gone: every report of the group is answered so
                # (503, retried by the worker), nothing of it written
                results = [failure] * len(group)
            else:  # a fault, nothing of the group written: each on its own, for its own answer
                results = []
                for job_id, decide, _ in group:
                    try:
                        results.append(await run_short(state, state.store.change, job_id, decide))
                    except Exception as error:
                        results.append(error)
        for (_, _, future), result in zip(group, results, strict=True):
            if future.done():  # its request went away meanwhile
                continue
            if isinstance(result, BaseException):
                future.set_exception(result)
            else:
                future.set_result(result)


def groups_of(state: ServerState) -> ReportGroups:
    """The server's ``ReportGroups``, made at its first report."""
    if state.report_groups is None:
        state.report_groups = ReportGroups(state)
    groups: ReportGroups = state.report_groups
    return groups
