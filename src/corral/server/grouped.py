"""Group commit: the protocol calls that arrive in the same turn of the event loop are applied by one
store call, in one transaction, instead of one transaction each: job reports (``Jobs.change_many``)
and claims (``Claims.claim_group``).

A request hands its item to ``TurnGroup.apply`` and awaits its own outcome. The first item of a turn
schedules the group's flush for the end of the turn (after every request task that became ready in
it has run up to its store call); the flush makes one store call, run as the protocol's short work
(``executor.Work.SHORT``: on the event loop where the store can take it without waiting), and
answers each request with its own outcome or its own error. When the group as a whole fails
(nothing of it written), each item is applied again on its own, so that a fault in one never
becomes another's answer, and nothing is lost or applied twice (the compare-and-set fence makes a
report that did apply refuse a second time; a claim with an Idempotency-Key is answered the runs
it started). A store that is busy or unavailable answers every item of the group so (503: the
worker sends it again).

Callers do not make groups: they declare a ``Batch`` and hand its items to the server's executor
(``executor.StoreExecutor.grouped``), which keeps one ``TurnGroup`` per batch.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from corral.domain import errors

Context = TypeVar("Context")
Item = TypeVar("Item")
Result = TypeVar("Result")

#: runs ``function(item)`` where the protocol's short work runs (the executor's ``SHORT`` placement)
RunShort = Callable[[Callable[[Any], Any], Any], Awaitable[Any]]


@dataclass(frozen=True)
class Batch(Generic[Context, Item, Result]):
    """Work a caller declares combinable with the same batch's items of one event-loop turn.

    ``apply_many(context, items)`` applies a group in one transaction and returns each item's
    outcome, or the exception that refused that item alone; it raises when the group as a whole
    fails, with nothing written. ``apply_one(context, item)`` applies a single item (a group of one,
    and each item after a failed group). ``context`` is the executor's (the server's state)."""

    name: str
    apply_many: Callable[[Context, list[Item]], Sequence[Result | BaseException]]
    apply_one: Callable[[Context, Item], Result]
    #: the most items one transaction applies (a larger turn is split)
    max_group: int


class TurnGroup(Generic[Item, Result]):
    """The items of one batch waiting for this turn's flush."""

    def __init__(
        self,
        apply_many: Callable[[list[Item]], Sequence[Result | BaseException]],
        apply_one: Callable[[Item], Result],
        max_group: int,
        run_short: RunShort,
    ) -> None:
        self._apply_many = apply_many
        self._apply_one = apply_one
        self._max_group = max_group
        self._run_short = run_short
        self._waiting: list[tuple[Item, asyncio.Future[Result]]] = []
        self._flushes: set[asyncio.Task[None]] = set()

    async def apply(self, item: Item) -> Result:
        """``item``'s outcome, applied with the other items of this turn."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Result] = loop.create_future()
        if not self._waiting:
            loop.call_soon(self._flush)
        self._waiting.append((item, future))
        return await future

    def _flush(self) -> None:
        while self._waiting:
            group, self._waiting = self._waiting[: self._max_group], self._waiting[self._max_group :]
            task = asyncio.ensure_future(self._apply(group))
            self._flushes.add(task)
            task.add_done_callback(self._flushes.discard)

    async def _apply(self, group: list[tuple[Item, asyncio.Future[Result]]]) -> None:
        items = [item for item, _ in group]
        results: Sequence[Result | BaseException]
        try:
            if len(items) == 1:
                results = [await self._run_short(self._apply_one, items[0])]
            else:
                results = await self._run_short(self._apply_many, items)
        except Exception as failure:
            if len(items) == 1 or isinstance(failure, errors.StoreUnavailable):
                # the store itself is busy or gone: every item of the group is answered so
                # (503, retried by the worker), nothing of it written
                results = [failure] * len(items)
            else:  # a fault, nothing of the group written: each on its own, for its own answer
                results = [await self._apply_alone(item) for item in items]
        for (_, future), result in zip(group, results, strict=True):
            if future.done():  # its request went away meanwhile
                continue
            if isinstance(result, BaseException):
                future.set_exception(result)
            else:
                future.set_result(result)

    async def _apply_alone(self, item: Item) -> Result | BaseException:
        try:
            result: Result = await self._run_short(self._apply_one, item)
        except Exception as error:
            return error
        return result
