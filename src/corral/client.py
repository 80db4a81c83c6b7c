"""The Python SDK: submit work, wait for it, read its output, cancel it; every route a user has.

``Client.submit`` takes a command and the fields of API.md's submit body as keywords, and returns a
handle (``corral.handles``) on the job, the gang (``gang_size`` > 1) or the array (``array``), with
``wait``, ``logs``, ``cancel``, ``refresh`` and ``status``. Every other call answers its typed model
of the wire contract (``corral.protocol.answers``: ``JobAnswer``, ``GangAnswer``, ``WhyAnswer``...),
which also reads like a dictionary (``job["status"]``). ``submit_body`` sends a body as written, for
full control; ``request_json`` reaches any route, answered as plain data.

    from corral.client import Client

    with Client("http://127.0.0.1:8765") as corral:
        job = corral.submit("python train.py", gpus=1, name="train")
        for line in job.logs(follow=True):
            print(line)
        print(job.wait().status)

Errors come back as ``ApiError`` with the server's stable ``code`` (``invalid_request`` naming the
field for a bad submit; ``bad_response`` for an answer that is not JSON or breaks its model); a
server that cannot be reached is ``ServerUnreachable``; a ``wait`` that ran out of time is
``WaitTimeout``. A 503 with ``Retry-After`` (a busy store: nothing was changed) is sent again after
the time it says, for up to ``busy_retry_s`` in all, before it is an error.

The calls only a worker makes (register, heartbeats, claims, reports, checkpoint and log uploads:
API.md's "The job protocol (workers)") are not here: they are ``corral.worker.calls.WorkerClient``.
The examples in the docstrings run against a real server and worker
(``tests/e2e/test_sdk_examples.py``), with ``corral`` a connected client.
"""

from __future__ import annotations

import shlex
import time
from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from corral.client_errors import DEFAULT_SERVER, ApiError, ClientError, ServerUnreachable, WaitTimeout
from corral.connection import Connection, LogChunk, log_chunk, parse
from corral.handles import ArrayHandle, GangHandle, Handle, JobHandle

__all__ = [
    "DEFAULT_SERVER",
    "ApiError",
    "ArrayHandle",
    "Client",
    "ClientError",
    "GangHandle",
    "Handle",
    "JobHandle",
    "LogChunk",
    "ServerUnreachable",
    "WaitTimeout",
]

if TYPE_CHECKING:
    from corral.http_response import Response
    from corral.protocol.answers import (
        ArrayAnswer,
        ArraySubmitted,
        EventAnswer,
        GangAnswer,
        GangSubmitted,
        HealthAnswer,
        JobAnswer,
        JobPage,
        PoolAnswer,
        UsagePage,
        WhyAnswer,
        WorkerAnswer,
        WorkerPage,
    )


class Client(Connection):
    """A connection to a corral server for a user (or an admin): ``Client(server, token=...,
    ca_file=...)``, used as a context manager or closed with ``close()``. Settings as for
    ``corral.connection.Connection``: ``token`` and ``ca_file`` default to ``CORRAL_TOKEN`` and
    ``CORRAL_CA_FILE``.

    >>> corral.health().status
    'ok'
    """

    # --- jobs, gangs and arrays ------------------------------------------------------------

    def submit(
        self,
        command: str | Sequence[str],
        *,
        gpus: int | None = None,
        gang_size: int | None = None,
        array: str | None = None,
        after: Sequence[str | dict[str, str]] | None = None,
        vram_mb: int | None = None,
        memory_mb: int | None = None,
        cpus: int | None = None,
        gpu_model: str | None = None,
        labels: Mapping[str, str] | None = None,
        idempotency_key: str | None = None,
        **fields: Any,
    ) -> JobHandle | GangHandle | ArrayHandle:
        """Submit ``command`` (a shell command line, or argv words quoted for the shell) and return
        a handle on what was made: a ``JobHandle``, a ``GangHandle`` when ``gang_size`` > 1, an
        ``ArrayHandle`` with ``array`` (``"0-99"``, ``"0-99:4"``, ``"1,5,7"``; ``%N`` runs at most N
        at once).

        ``gpus``, ``vram_mb``, ``memory_mb`` and ``cpus`` (per task) go into ``resources``,
        ``gpu_model`` and ``labels`` into ``constraints``; every other keyword is a field of the
        submit body as API.md names it (``name``, ``env``, ``pool``, ``priority``,
        ``preemption_class``, ``checkpoint``, ``max_retries``, ``walltime_s``, ``workdir``...), sent as
        given: the server checks them, and a bad one is ``ApiError`` 400 ``invalid_request`` naming
        the field. Unset, the server's defaults apply. ``after``: conditions on other jobs, gangs
        or arrays, each ``"ok:ID"`` (``notok:``, ``any:``) or ``{"id": ..., "when": ...}``.
        ``idempotency_key``: a retried submit with the same key answers the first one.

        >>> job = corral.submit(["python3", "-c", "print(6 * 7)"], cpus=1, env={"SEED": "1"})
        >>> job.wait(timeout=60).status, list(job.logs())
        ('done', ['42'])
        >>> later = corral.submit("echo after", after=[f"ok:{job.id}"])
        >>> later.wait(timeout=60).status
        'done'
        >>> corral.submit("true", priority="high")
        Traceback (most recent call last):
        ...
        corral.client_errors.ApiError: 400 invalid_request: ...priority...
        """
        if isinstance(command, Mapping):
            raise TypeError(
                "submit takes the command (a string, or a list of argv words) and the body's fields as"
                " keywords; to send a whole body as written, use submit_body(body)"
            )
        if not isinstance(command, str):
            command = shlex.join(command)
        body: dict[str, Any] = {"command": command, **fields}
        asked = {"gpus": gpus, "vram_mb": vram_mb, "memory_mb": memory_mb, "cpus": cpus}
        resources = {name: value for name, value in asked.items() if value is not None}
        if resources:
            body["resources"] = {**dict(body.get("resources") or {}), **resources}
        wanted = {"gpu_model": gpu_model, "labels": dict(labels) if labels is not None else None}
        constraints = {name: value for name, value in wanted.items() if value is not None}
        if constraints:
            body["constraints"] = {**dict(body.get("constraints") or {}), **constraints}
        if gang_size is not None:
            body["gang_size"] = gang_size
        return self.handle(self.submit_body(body, idempotency_key, array=array, after=after))

    def submit_body(
        self,
        body: dict[str, Any],
        idempotency_key: str | None = None,
        array: str | None = None,
        after: Sequence[str | dict[str, str]] | None = None,
    ) -> JobAnswer | GangSubmitted | ArraySubmitted:
        """Submit a body as written (API.md's ``POST /jobs``), for full control; the answer as the
        server gave it: the job, or a gang's or an array's id and task ids. ``client.handle(answer)``
        makes a handle of it. ``array`` and ``after`` as for ``submit``.

        >>> answer = corral.submit_body({"command": "echo raw", "resources": {"cpus": 1}})
        >>> answer.status in ("pending", "running", "done")
        True
        >>> corral.handle(answer).wait(timeout=60).status
        'done'
        """
        headers = {"Idempotency-Key": idempotency_key} if idempotency_key else None
        if array is not None:
            body = {**body, "array": array}
        if after:
            body = {**body, "after": [parse_after(item) if isinstance(item, str) else item for item in after]}
        response = self.request("POST", "/jobs", body, headers=headers)
        return _submitted(response, self._decode(response))

    def handle(
        self, target: str | JobAnswer | GangSubmitted | ArraySubmitted
    ) -> JobHandle | GangHandle | ArrayHandle:
        """A handle on a job, gang or array: by id (``j-…``, ``g-…``, ``a-…``; any other id is taken
        for a job's), or from what ``submit_body`` or ``submit_batch`` answered. Nothing is sent.

        >>> job = corral.submit("true")
        >>> corral.handle(job.id) == job
        True
        """
        if isinstance(target, str):
            if target.startswith("g-"):
                return GangHandle(self, target)
            if target.startswith("a-"):
                return ArrayHandle(self, target)
            return JobHandle(self, target)
        from corral.protocol.answers import ArraySubmitted, GangSubmitted

        if isinstance(target, ArraySubmitted):
            return ArrayHandle(self, target.array_id, list(target.tasks))
        if isinstance(target, GangSubmitted):
            return GangHandle(self, target.gang_id, list(target.tasks))
        return JobHandle(self, target.id)

    def submit_batch(
        self, jobs: list[dict[str, Any]], idempotency_key: str | None = None
    ) -> list[JobAnswer | GangSubmitted | ArraySubmitted]:
        """Submit many bodies (as ``submit_body`` takes them) in one transaction: all or none (400
        names the index of the first bad one); each answer as ``submit_body``'s, in order.

        >>> answers = corral.submit_batch([{"command": "echo one"}, {"command": "echo two"}])
        >>> [corral.handle(answer).wait(timeout=60).status for answer in answers]
        ['done', 'done']
        """
        headers = {"Idempotency-Key": idempotency_key} if idempotency_key else None
        response = self.request("POST", "/jobs/batch", {"jobs": jobs}, headers=headers, timeout_s=120.0)
        data = self._decode(response)
        items = data.get("items") if isinstance(data, dict) else None
        if not isinstance(items, list):
            raise ApiError(response.status_code, "bad_response", "answer has no items list", data)
        return [_submitted(response, item) for item in items]

    def list_jobs_page(self, limit: int = 500, after: str | None = None, **filters: Any) -> JobPage:
        """One page of ``GET /jobs``: ``items`` and the cursor of the next page (``next``, None on the
        last). ``filters``: API.md's query parameters (``status``, ``gang_id``, ``array_id``,
        ``pool``, ``worker_id``, ``user``, ``order="newest"``).

        >>> page = corral.list_jobs_page(limit=1, order="newest")
        >>> len(page.items), page.next is not None
        (1, True)
        """
        from corral.protocol.answers import JobPage

        params = {key: value for key, value in filters.items() if value is not None}
        params["limit"] = limit
        if after:
            params["after"] = after
        return self._answer(JobPage, "GET", "/jobs", params=params)

    def iter_jobs(self, page_size: int = 500, **filters: Any) -> Iterator[JobAnswer]:
        """Every job matching ``filters`` (as for ``list_jobs_page``), following the cursor page by
        page.

        >>> array = corral.submit("true", array="0-1")
        >>> sorted(job.array_index for job in corral.iter_jobs(array_id=array.id))
        [0, 1]
        """
        after = None
        while True:
            page = self.list_jobs_page(limit=page_size, after=after, **filters)
            yield from page.items
            after = page.next
            if not after:
                return

    def get_job(self, job_id: str) -> JobAnswer:
        """The job object (API.md "Jobs and gangs"); ``ApiError`` 404 ``not_found`` for an unknown id.

        >>> job = corral.submit("true", name="read-me")
        >>> corral.get_job(job.id).name
        'read-me'
        """
        from corral.protocol.answers import JobAnswer

        return self._answer(JobAnswer, "GET", f"/jobs/{job_id}")

    def events(self, job_id: str) -> list[EventAnswer]:
        """The job's history, oldest first (``JobHandle.events``).

        >>> job = corral.submit("true", gpus=64)
        >>> [event.to for event in corral.events(job.id)]
        ['pending']
        """
        from corral.protocol.answers import EventsAnswer

        return self._answer(EventsAnswer, "GET", f"/jobs/{job_id}/events").items

    def why(self, job_id: str) -> WhyAnswer:
        """Why the job is not running, or why it ended (``JobHandle.why``).

        >>> corral.why(corral.submit("true", gpus=64).id).status
        'pending'
        """
        from corral.protocol.answers import WhyAnswer

        return self._answer(WhyAnswer, "GET", f"/jobs/{job_id}/why")

    def cancel(self, job_id: str) -> JobAnswer:
        """Cancel a job (``JobHandle.cancel``); the job after the request.

        >>> job = corral.submit("true", gpus=64)  # waits for ever: no worker has 64 GPUs
        >>> corral.cancel(job.id).status
        'cancelled'
        >>> corral.cancel(job.id)
        Traceback (most recent call last):
        ...
        corral.client_errors.ApiError: 409 already_terminal: ...
        """
        from corral.protocol.answers import JobAnswer

        return self._answer(JobAnswer, "POST", f"/jobs/{job_id}/cancel")

    def logs(self, job_id: str, attempt: int | None = None, offset: int = 0) -> LogChunk:
        """The stored output of an attempt (the latest by default) from byte ``offset``, as bytes
        with where they start; ``JobHandle.logs`` reads it as lines.

        >>> job = corral.submit("printf abc")
        >>> job.wait(timeout=60).status
        'done'
        >>> corral.logs(job.id, offset=1).data
        b'bc'
        """
        params: dict[str, Any] = {"offset": offset}
        if attempt is not None:
            params["attempt"] = attempt
        return log_chunk(self.request("GET", f"/jobs/{job_id}/logs", params=params, timeout_s=120.0))

    def follow_logs(
        self, job_id: str, attempt: int | None = None, offset: int = 0, poll_s: float = 1.0
    ) -> Iterator[LogChunk]:
        """The attempt's output as it is written, until the attempt ends: each chunk as it is
        stored. Polls ``GET /jobs/{id}/logs`` from where the last read ended (so it resumes cleanly
        through a lost connection or another replica) and ends once the job is past the attempt.

        >>> job = corral.submit("echo one; echo two")
        >>> b"".join(chunk.data for chunk in corral.follow_logs(job.id, poll_s=0.1)).split()
        [b'one', b'two']
        """
        while True:
            chunk = self.logs(job_id, attempt, offset)
            attempt = chunk.attempt
            if chunk.data:
                yield chunk
                offset = chunk.start + len(chunk.data)
                if offset < chunk.size:
                    continue
            job = self.get_job(job_id)
            # ``attempt`` is the run number (``attempts`` counts only the runs not refunded); 0: the
            # output was read before the first attempt started, which it may have since
            if not attempt and job.status not in ("done", "failed", "cancelled"):
                attempt = None  # not started when read: follow the attempt it has by the next read
            elif job.attempt != attempt or job.status not in ("running", "preempting"):
                last = self.logs(job_id, attempt, offset)  # bytes stored before it ended
                if last.data:
                    yield last
                return
            time.sleep(poll_s)

    def gang(self, gang_id: str) -> GangAnswer:
        """The gang: its size, status and every task's job by rank (``GangHandle.refresh``).

        >>> answer = corral.gang(corral.submit("true", gang_size=2).id)
        >>> answer.size, [task.gang_index for task in answer.tasks]
        (2, [0, 1])
        """
        from corral.protocol.answers import GangAnswer

        return self._answer(GangAnswer, "GET", f"/gangs/{gang_id}")

    def cancel_gang(self, gang_id: str) -> GangAnswer:
        """Cancel every task of the gang (``GangHandle.cancel``).

        >>> corral.cancel_gang(corral.submit("true", gang_size=2, gpus=64).id).status
        'cancelled'
        """
        from corral.protocol.answers import GangAnswer

        return self._answer(GangAnswer, "POST", f"/gangs/{gang_id}/cancel")

    def gang_events(self, gang_id: str) -> list[EventAnswer]:
        """Every task's events in time order, each naming its task (``job_id``, ``gang_index``).

        >>> gang = corral.submit("true", gang_size=2, gpus=64)
        >>> sorted({event["job_id"] for event in corral.gang_events(gang.id)}) == sorted(
        ...     task.id for task in gang.tasks
        ... )
        True
        """
        from corral.protocol.answers import EventsAnswer

        return self._answer(EventsAnswer, "GET", f"/gangs/{gang_id}/events").items

    def gang_why(self, gang_id: str) -> WhyAnswer:
        """The gang's status and the reasons of its most telling task (named by ``job_id``).

        >>> corral.gang_why(corral.submit("true", gang_size=2, gpus=64).id).status
        'blocked'
        """
        from corral.protocol.answers import WhyAnswer

        return self._answer(WhyAnswer, "GET", f"/gangs/{gang_id}/why")

    def array(self, array_id: str, limit: int = 100) -> ArrayAnswer:
        """The array: its tasks' counts by status and its first ``limit`` tasks by index
        (``ArrayHandle.refresh``).

        >>> array = corral.submit("true", array="1,5,7")
        >>> answer = corral.array(array.id)
        >>> answer.size, [task.array_index for task in answer.tasks]
        (3, [1, 5, 7])
        """
        from corral.protocol.answers import ArrayAnswer

        return self._answer(ArrayAnswer, "GET", f"/arrays/{array_id}", params={"limit": limit})

    def cancel_array(self, array_id: str) -> ArrayAnswer:
        """Cancel every task of the array that has not ended, owner or admin (``ArrayHandle.cancel``);
        ``ApiError`` 409 ``already_terminal`` when every task had ended.

        >>> array = corral.submit("true", array="0-1", gpus=64)
        >>> corral.cancel_array(array.id).counts
        {'cancelled': 2}
        """
        from corral.protocol.answers import ArrayAnswer

        return self._answer(ArrayAnswer, "POST", f"/arrays/{array_id}/cancel")

    # --- workers ---------------------------------------------------------------------------

    def workers(self) -> list[WorkerAnswer]:
        """Every registered worker: resources, what it uses and runs, its status.

        >>> sorted((worker.id, worker.status) for worker in corral.workers())
        [('w1', 'active'), ('w2', 'active')]
        """
        return self.worker_page().items

    def worker_page(self) -> WorkerPage:
        """Every worker, and the server's topology levels (``CORRAL_TOPOLOGY_LEVELS``, widest first).

        >>> corral.worker_page().topology_levels
        ['topology.block', 'topology.rack']
        """
        from corral.protocol.answers import WorkerPage

        return self._answer(WorkerPage, "GET", "/workers")

    def worker(self, worker_id: str) -> WorkerAnswer:
        """One worker; ``ApiError`` 404 for an unknown id.

        >>> corral.worker("w1").resources.cpus
        4
        """
        from corral.protocol.answers import WorkerAnswer

        return self._answer(WorkerAnswer, "GET", f"/workers/{worker_id}")

    def drain_worker(self, worker_id: str) -> WorkerAnswer:
        """Place no more work on the worker (admin); what runs there finishes.

        >>> corral.drain_worker("w1").status
        'draining'
        >>> corral.undrain_worker("w1").status
        'active'
        """
        from corral.protocol.answers import WorkerAnswer

        return self._answer(WorkerAnswer, "POST", f"/workers/{worker_id}/drain")

    def undrain_worker(self, worker_id: str) -> WorkerAnswer:
        """Place work on a drained worker again (admin).

        >>> corral.undrain_worker("w2").status
        'active'
        """
        from corral.protocol.answers import WorkerAnswer

        return self._answer(WorkerAnswer, "POST", f"/workers/{worker_id}/undrain")

    def remove_worker(self, worker_id: str) -> None:
        """Forget an offline worker that holds no job (admin); ``ApiError`` 409 otherwise.

        >>> corral.remove_worker("w1")
        Traceback (most recent call last):
        ...
        corral.client_errors.ApiError: 409 conflict: ...
        """
        self.request("DELETE", f"/workers/{worker_id}")

    # --- usage -----------------------------------------------------------------------------

    def usage(self, since: str | None = None, until: str | None = None, by: str = "user,pool") -> UsagePage:
        """GPU- and CPU-seconds of a window (RFC 3339 times; the server's default: the last 7 days)
        per user, pool or both (API.md "Usage"); a user's token sees its own rows only.

        >>> corral.usage(since="2020-01-01T00:00:00Z", until="2020-01-02T00:00:00Z", by="pool").items
        []
        """
        params = {"by": by, **{name: value for name, value in (("since", since), ("until", until)) if value}}
        from corral.protocol.answers import UsagePage

        return self._answer(UsagePage, "GET", "/usage", params=params)

    # --- pools -----------------------------------------------------------------------------

    def pools(self) -> list[PoolAnswer]:
        """Every pool (stored, implied by a descendant, or named by a job), in path order.

        >>> "default" in [pool.path for pool in corral.pools()]
        True
        """
        from corral.protocol.answers import PoolPage

        return self._answer(PoolPage, "GET", "/pools").items

    def pool(self, path: str) -> PoolAnswer:
        """One pool: its settings, demand, usage and fair share; 404 for an unknown path.

        >>> corral.pool("default").path
        'default'
        """
        from corral.protocol.answers import PoolAnswer

        return self._answer(PoolAnswer, "GET", f"/pools/{path}")

    def put_pool(self, path: str, body: dict[str, Any] | None = None) -> PoolAnswer:
        """Create or replace the pool's settings (admin; a setting left out is inherited; see API.md).

        >>> corral.put_pool("research/vision", {"weight": 2}).settings.weight
        2.0
        >>> corral.delete_pool("research/vision")
        >>> corral.delete_pool("research")
        """
        from corral.protocol.answers import PoolAnswer

        return self._answer(PoolAnswer, "PUT", f"/pools/{path}", body or {})

    def delete_pool(self, path: str) -> None:
        """Remove a pool's settings (admin); 409 while it holds jobs.

        >>> corral.put_pool("scratch", {"weight": 1}).path
        'scratch'
        >>> corral.delete_pool("scratch")
        >>> "scratch" in [pool.path for pool in corral.pools()]
        False
        """
        self.request("DELETE", f"/pools/{path}")

    # --- operations ------------------------------------------------------------------------

    def health(self) -> HealthAnswer:
        """The server's ``GET /health``: ``status``, ``instance_id``, ``uptime_s``, ``version``.

        >>> corral.health().uptime_s > 0
        True
        """
        from corral.protocol.answers import HealthAnswer

        return self._answer(HealthAnswer, "GET", "/health")


def parse_after(text: str) -> dict[str, str]:
    """``"ok:ID"`` (or ``notok:``, ``any:``; a bare ``ID`` means ``ok``) as an ``after`` condition.

    >>> parse_after("any:j-1f2e")
    {'id': 'j-1f2e', 'when': 'any'}
    """
    when, _, job_id = text.strip().rpartition(":")
    return {"id": job_id, "when": when or "ok"}


def _submitted(response: Response, data: Any) -> JobAnswer | GangSubmitted | ArraySubmitted:
    """A submit's item: a gang's ``{gang_id, tasks}``, an array's ``{array_id, tasks}``, else the job."""
    from corral.protocol.answers import ArraySubmitted, GangSubmitted, JobAnswer

    if isinstance(data, dict) and "command" not in data and "array_id" in data:
        return parse(ArraySubmitted, response, data)
    if isinstance(data, dict) and "command" not in data and "gang_id" in data:
        return parse(GangSubmitted, response, data)
    return parse(JobAnswer, response, data)
