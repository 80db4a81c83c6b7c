"""The dashboard: server-rendered pages (Jinja2), a small script of our own for live updates, no
build step and no external request (the CSS and the script are served from the package).

Pages: ``/`` the cluster overview (with the last 24 hours of the queue and the GPUs allocated, from
the samples the ``history`` loop stores once per ``CORRAL_HISTORY_INTERVAL_S``), ``/ui/jobs`` the
job list (newest first, each job's reason, filters: an array's tasks are ``?array_id=``, cursor
pages), ``/ui/jobs/{id}`` a job (its fields by group, its timeline on a time axis, why, live logs,
cancel), ``/ui/gangs/{id}`` a gang (ranks, workers, the drain story),
``/ui/workers`` one cell per GPU, ``/ui/pools`` the pools as a tree, each with its fair share
against its usage. Each page answers ``?partial=1`` with its live part alone, which the script
fetches every few seconds; cancel is a plain form post (it works without the script too). With
auth on, a page asked for without a valid token answers the sign-in page (``auth.sign_in_page``).

Every page reads the store: its handler is a plain function, run by the server's executor as long work
(``state.store_handler``, ``Work.LONG``: a store thread with the short switch interval).
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import jinja2
from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response
from starlette.routing import Route

from corral import __version__
from corral.domain import errors
from corral.domain.clock import to_rfc3339
from corral.domain.status import Status
from corral.server import changes
from corral.server.auth import Role, principal_of
from corral.server.dashboard import views
from corral.server.executor import Work
from corral.server.http import query_int
from corral.server.openapi import HTML, Operation, integer, string
from corral.server.routes.jobs import _decode_cursor, _encode_cursor, _record_cancel, standing
from corral.server.routes.pools import fair_share_now
from corral.server.state import state_of, store_handler
from corral.store.base import JobFilter

_HERE = Path(__file__).parent
_ENVIRONMENT = jinja2.Environment(
    loader=jinja2.FileSystemLoader(_HERE / "templates"),
    autoescape=jinja2.select_autoescape(default=True),
    undefined=jinja2.StrictUndefined,
    trim_blocks=True,
    lstrip_blocks=True,
)
_ENVIRONMENT.filters["rfc3339"] = to_rfc3339
_STATIC = {
    "corral.css": "text/css; charset=utf-8",
    "corral.js": "text/javascript; charset=utf-8",
    "login.js": "text/javascript; charset=utf-8",
}
PAGE_SIZE = 100
STATUSES = [status.value for status in Status]


def _render(request: Request, template: str, status_code: int = 200, **context: Any) -> HTMLResponse:
    partial = request.query_params.get("partial") == "1"
    html = _ENVIRONMENT.get_template(template).render(
        partial=partial, version=__version__, path=request.url.path, statuses=STATUSES, **context
    )
    return HTMLResponse(html, status_code=status_code, headers={"Cache-Control": "no-store"})


def _not_found(request: Request, what: str) -> HTMLResponse:
    return _render(request, "not_found.html", status_code=404, title="Not found", what=what)


def overview(request: Request) -> Response:
    state = state_of(request)
    principal = principal_of(request)
    # a user's own usage, as GET /usage answers them; an admin's (or everyone's, without auth) all
    own_user = principal.name if principal is not None and principal.role != Role.ADMIN else None
    rows = views.workers(state.store.workers)
    totals = views.gpu_totals(rows)
    jobs = state.store.jobs.count_jobs_by_status()
    now = state.clock.now()
    samples = state.store.history.samples(now - views.HISTORY_WINDOW_S, now)
    return _render(
        request,
        "overview.html",
        title="Cluster",
        gpus=totals,
        jobs=jobs,
        jobs_total=sum(jobs.values()),
        workers=rows,
        pools=views.pool_tree(state.store.jobs, fair_share_now(state)),
        gpu_hours=views.gpu_hours_by_pool(state.store.usage, now, own_user),
        own_usage=own_user is not None,
        history=views.cluster_history(samples, now, state.settings.history_interval_s),
        history_every=views.interval_words(state.settings.history_interval_s),
        now=to_rfc3339(now),
    )


def job_list(request: Request) -> Response:
    state = state_of(request)
    params = request.query_params
    status = params.get("status") or None
    if status is not None and status not in STATUSES:
        raise errors.InvalidRequest(f"unknown status {status!r}", field="status")
    filters = JobFilter(
        status=(status,) if status else (),
        pool=params.get("pool") or None,
        worker_id=params.get("worker_id") or None,
        gang_id=params.get("gang_id") or None,
        array_id=params.get("array_id") or None,
        newest=True,  # what was just submitted comes first (issue 23), as `corral jobs` lists it
    )
    after = _decode_cursor(params["after"]) if params.get("after") else None
    jobs = standing(views.job_list(state.store.jobs, filters, PAGE_SIZE, after), state.standing_verdicts)
    kept = {
        key: params[key] for key in ("status", "pool", "worker_id", "gang_id", "array_id") if params.get(key)
    }
    next_link = None
    if len(jobs) == PAGE_SIZE:
        next_link = "/ui/jobs?" + urlencode({**kept, "after": _encode_cursor(jobs[-1])})
    return _render(
        request,
        "jobs.html",
        title="Jobs",
        jobs=jobs,
        filters=kept,
        next_link=next_link,
        first_link="/ui/jobs?" + urlencode(kept) if after else None,
    )


def job_page(request: Request) -> Response:
    state = state_of(request)
    job_id = request.path_params["job_id"]
    job = state.store.jobs.get_job(job_id)
    if job is None:
        return _not_found(request, f"job {job_id}")
    (job,) = standing([job], state.standing_verdicts)  # the reason it shows now, as the API says it
    page = views.job_page(state.store, job, state.clock.now(), principal_of(request))
    shown = query_int(request, "attempt", required=False, default=job.attempts)
    return _render(request, "job.html", title=f"Job {job.id}", shown_attempt=shown, **page)


def gang_page(request: Request) -> Response:
    state = state_of(request)
    gang_id = request.path_params["gang_id"]
    page = views.gang_page(state.store.jobs, gang_id)
    if page is None:
        return _not_found(request, f"gang {gang_id}")
    return _render(request, "gang.html", title=f"Gang {gang_id}", **page)


def workers_page(request: Request) -> Response:
    state = state_of(request)
    rows = views.workers(state.store.workers, state.topology_levels)
    return _render(request, "workers.html", title="Workers", workers=rows, gpus=views.gpu_totals(rows))


def pools_page(request: Request) -> Response:
    state = state_of(request)
    totals = views.gpu_totals(views.workers(state.store.workers))
    return _render(
        request,
        "pools.html",
        title="Pools",
        pools=views.pool_tree(state.store.jobs, fair_share_now(state)),
        gpus=totals,
    )


def cancel_job(request: Request) -> Response:
    """The job page's cancel button (a form post): cancel, then back to the job page."""
    state = state_of(request)
    job_id = request.path_params["job_id"]
    if state.store.jobs.get_job(job_id) is None:
        return _not_found(request, f"job {job_id}")
    with contextlib.suppress(errors.AlreadyTerminal):  # a second click, or it ended meanwhile
        _record_cancel(state, changes.cancel(state.store.jobs, job_id, state.clock.now()))
    return RedirectResponse(f"/ui/jobs/{job_id}", status_code=303)


def cancel_gang(request: Request) -> Response:
    state = state_of(request)
    gang_id = request.path_params["gang_id"]
    tasks = state.store.jobs.gang_tasks(gang_id)
    if not tasks:
        return _not_found(request, f"gang {gang_id}")
    with contextlib.suppress(errors.AlreadyTerminal):
        _record_cancel(state, changes.cancel(state.store.jobs, tasks[0].id, state.clock.now()))
    return RedirectResponse(f"/ui/gangs/{gang_id}", status_code=303)


async def static(request: Request) -> Response:
    name = request.path_params["name"]
    media_type = _STATIC.get(name)
    if media_type is None:
        raise errors.NotFound(f"no dashboard file {name}")
    return Response(
        (_HERE / "static" / name).read_bytes(),
        media_type=media_type,
        headers={"Cache-Control": "public, max-age=300"},
    )


_PARTIAL = (string("partial", "1: the page's live part alone (for the live updates)", enum=["0", "1"]),)
_TAG = "dashboard"
described = [
    Operation("GET", "/", "the dashboard: cluster overview", _TAG, {200: HTML}, query=_PARTIAL, errors=()),
    Operation(
        "GET",
        "/ui/jobs",
        "the dashboard: jobs, with filters and cursor pages",
        _TAG,
        {200: HTML},
        query=(
            *_PARTIAL,
            string("status", enum=STATUSES),
            string("pool"),
            string("worker_id"),
            string("gang_id"),
            string("array_id", "an array's tasks"),
            string("after", "the cursor of the next page"),
        ),
        errors=(400,),
    ),
    Operation(
        "GET",
        "/ui/jobs/{job_id}",
        "the dashboard: a job",
        _TAG,
        {200: HTML, 404: HTML},
        query=(*_PARTIAL, integer("attempt", "whose logs to show (default: the latest)")),
        errors=(400,),
    ),
    Operation(
        "POST",
        "/ui/jobs/{job_id}/cancel",
        "the dashboard's cancel button",
        _TAG,
        {303: None, 404: HTML},
        errors=(),
    ),
    Operation(
        "GET",
        "/ui/gangs/{gang_id}",
        "the dashboard: a gang",
        _TAG,
        {200: HTML, 404: HTML},
        query=_PARTIAL,
        errors=(),
    ),
    Operation(
        "POST",
        "/ui/gangs/{gang_id}/cancel",
        "the dashboard's gang cancel button",
        _TAG,
        {303: None, 404: HTML},
        errors=(),
    ),
    Operation(
        "GET",
        "/ui/workers",
        "the dashboard: workers, one cell per GPU",
        _TAG,
        {200: HTML},
        query=_PARTIAL,
        errors=(),
    ),
    Operation("GET", "/ui/pools", "the dashboard: pools", _TAG, {200: HTML}, query=_PARTIAL, errors=()),
    Operation(
        "GET",
        "/ui/static/{name}",
        "the dashboard's stylesheet and script",
        _TAG,
        {200: tuple(media_type.split(";")[0] for media_type in _STATIC.values())},
        errors=(404,),
    ),
]

routes = [
    Route("/", store_handler(Work.LONG, overview), methods=["GET"]),
    Route("/ui/jobs", store_handler(Work.LONG, job_list), methods=["GET"]),
    Route("/ui/jobs/{job_id}", store_handler(Work.LONG, job_page), methods=["GET"]),
    Route("/ui/jobs/{job_id}/cancel", store_handler(Work.LONG, cancel_job), methods=["POST"]),
    Route("/ui/gangs/{gang_id}", store_handler(Work.LONG, gang_page), methods=["GET"]),
    Route("/ui/gangs/{gang_id}/cancel", store_handler(Work.LONG, cancel_gang), methods=["POST"]),
    Route("/ui/workers", store_handler(Work.LONG, workers_page), methods=["GET"]),
    Route("/ui/pools", store_handler(Work.LONG, pools_page), methods=["GET"]),
    Route("/ui/static/{name}", static, methods=["GET"]),
]
