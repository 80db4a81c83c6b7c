"""Arrays (API.md "Arrays and dependencies"): ``GET /arrays/{id}`` (counts by status and the first
page of tasks), ``GET /arrays/{id}/events`` and ``/why`` (as a gang's: "Lists and handles") and
``POST /arrays/{id}/cancel``. An array's tasks are jobs of their own: they are
listed with ``GET /jobs?array_id=`` and read, cancelled and followed like any job."""

from __future__ import annotations

from functools import partial
from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from corral.core import lifecycle
from corral.domain import errors
from corral.domain.arrays import MAX_ARRAY_TASKS
from corral.domain.records import Job
from corral.domain.status import LEASED, TERMINAL, Status
from corral.protocol.answers import ArrayAnswer, EventsAnswer, WhyAnswer
from corral.server.executor import Work
from corral.server.http import answer, query_int
from corral.server.openapi import Operation, integer
from corral.server.routes.jobs import _job_wire, _reasons, _record_cancel, standing, tasks_story
from corral.server.state import ServerState, state_of

#: tasks ``GET /arrays/{id}`` lists unless ``limit`` says otherwise
DEFAULT_TASKS = 100


def _array_or_404(state: ServerState, array_id: str, limit: int) -> tuple[dict[str, int], list[Job]]:
    """The array's counts and its first ``limit`` tasks, at least one: the throttle is read from
    a task, also for ``limit=0`` (counts only)."""
    counts = state.store.jobs.array_counts(array_id)
    if not counts:
        raise errors.NotFound(f"array {array_id} not found")
    return counts, standing(state.store.jobs.array_tasks(array_id, max(limit, 1)), state.standing_verdicts)


def _array_to_wire(
    request: Request, array_id: str, counts: dict[str, int], tasks: list[Job], limit: int
) -> dict[str, Any]:
    first = tasks[0] if tasks else None
    return {
        "array_id": array_id,
        "size": sum(counts.values()),
        "throttle": first.array_throttle if first else None,
        "counts": counts,
        "tasks": [_job_wire(request, task) for task in tasks[:limit]],
    }


async def get_array(request: Request) -> Response:
    state = state_of(request)
    array_id = request.path_params["array_id"]
    limit = query_int(request, "limit", required=False, default=DEFAULT_TASKS)
    assert limit is not None
    if not 0 <= limit <= MAX_ARRAY_TASKS:
        raise errors.InvalidRequest(f"limit must be between 0 and {MAX_ARRAY_TASKS}", field="limit")
    counts, tasks = await state.executor.run(Work.LONG, _array_or_404, state, array_id, limit)
    return answer(ArrayAnswer, _array_to_wire(request, array_id, counts, tasks, limit))


async def cancel_array(request: Request) -> Response:
    state = state_of(request)
    array_id = request.path_params["array_id"]
    changed, counts, tasks = await state.executor.run(
        Work.STORE, _cancel_array, state, array_id, state.clock.now()
    )
    _record_cancel(state, changed)
    return answer(ArrayAnswer, _array_to_wire(request, array_id, counts, tasks, DEFAULT_TASKS))


async def array_events(request: Request) -> Response:
    state = state_of(request)
    return await state.executor.run(Work.LONG, _array_events, state, request.path_params["array_id"])


def _array_events(state: ServerState, array_id: str) -> Response:
    """Every task's events in one story, in time order, each naming its task (``job_id``,
    ``array_index``): what ``corral events A`` prints (as a gang's, ``GET /gangs/{id}/events``)."""
    _, tasks = _array_or_404(state, array_id, MAX_ARRAY_TASKS)
    return answer(EventsAnswer, {"items": tasks_story(state, tasks, "array_index")})


async def array_why(request: Request) -> Response:
    state = state_of(request)
    return await state.executor.run(Work.LONG, _array_why, state, request.path_params["array_id"])


def _array_why(state: ServerState, array_id: str) -> Response:
    """The array's status (``array_status``), its counts, and the reasons of the task that tells
    its story: the first failed one, else the first still waiting (its tasks share one request, so
    one waiting task waits for what they all wait for), else the first not ended, else the first."""
    counts, tasks = _array_or_404(state, array_id, MAX_ARRAY_TASKS)
    failed = [task for task in tasks if task.status == Status.FAILED]
    waiting = [task for task in tasks if not task.status.is_terminal and not task.status.holds_resources]
    open_tasks = [task for task in tasks if not task.status.is_terminal]
    told = (failed or waiting or open_tasks or tasks)[0]
    return answer(
        WhyAnswer,
        {
            "status": array_status(counts),
            "reasons": [reason.to_dict() for reason in _reasons(state, told)],
            "array_id": array_id,
            "counts": counts,
            "job_id": told.id,
        },
    )


def array_status(counts: dict[str, int]) -> str:
    """One word for an array: ``running`` while a task runs (or is being stopped), else ``pending``
    while one waits, else ``done`` when every task is, else ``failed`` when one failed, else
    ``cancelled``."""
    if any(status in LEASED for status in counts):
        return "running"
    if any(status not in TERMINAL for status in counts):
        return "pending"
    if set(counts) == {"done"}:
        return "done"
    return "failed" if "failed" in counts else "cancelled"


def _cancel_array(
    state: ServerState, array_id: str, now: float
) -> tuple[tuple[Job, ...], dict[str, int], list[Job]]:
    """Cancel every task not yet ended, in one transaction (each task as ``POST /jobs/{id}/cancel``
    would: a running one is stopped first). 409 ``already_terminal`` when every task has ended."""
    _, tasks = _array_or_404(state, array_id, MAX_ARRAY_TASKS)
    open_tasks = [task.id for task in tasks if task.status not in TERMINAL]
    if not open_tasks:
        raise errors.AlreadyTerminal(f"every task of array {array_id} has ended")
    cancels = [(task_id, partial(lifecycle.cancel, now=now)) for task_id in open_tasks]
    results = state.store.jobs.change_many(cancels)
    changed: list[Job] = []
    for result in results:
        if isinstance(result, tuple):
            changed.extend(result)
        elif isinstance(result, errors.AlreadyTerminal):
            continue  # ended meanwhile
        elif isinstance(result, Exception):
            raise result
    counts, first = _array_or_404(state, array_id, DEFAULT_TASKS)
    return tuple(changed), counts, first


described = [
    Operation(
        "GET",
        "/arrays/{array_id}",
        "the array: its tasks' counts by status and its first tasks by index",
        "arrays",
        {200: ArrayAnswer},
        query=(integer("limit", f"tasks listed, 0..{MAX_ARRAY_TASKS} (default {DEFAULT_TASKS})", minimum=0),),
        errors=(404,),
    ),
    Operation(
        "GET",
        "/arrays/{array_id}/events",
        "every task's status history in one story, oldest first (each item names its job_id)",
        "arrays",
        {200: EventsAnswer},
        errors=(404,),
    ),
    Operation(
        "GET",
        "/arrays/{array_id}/why",
        "why the array is where it is: its counts and the reasons of its most telling task",
        "arrays",
        {200: WhyAnswer},
        errors=(404,),
    ),
    Operation(
        "POST",
        "/arrays/{array_id}/cancel",
        "cancel every task of the array not yet ended",
        "arrays",
        {200: ArrayAnswer},
        errors=(404, 409),
    ),
]

routes = [
    Route("/arrays/{array_id}", get_array, methods=["GET"]),
    Route("/arrays/{array_id}/events", array_events, methods=["GET"]),
    Route("/arrays/{array_id}/why", array_why, methods=["GET"]),
    Route("/arrays/{array_id}/cancel", cancel_array, methods=["POST"]),
]
