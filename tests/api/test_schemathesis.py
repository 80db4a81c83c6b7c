"""Schemathesis against a running server, on SQLite and on PostgreSQL: every operation of
``/openapi.json`` with a bounded number of generated requests, valid and invalid.

Each answer must be no 5xx, have a status the document declares for it, a content type it declares,
a body that holds to its own schema, and no stack trace; and nothing may be lost: every job's event
history stays a legal chain of transitions.

Every operation is fuzzed three ways: valid requests, invalid ones, and valid ones aimed at state
that exists (the path's ``job_id`` / ``gang_id`` / ``worker_id`` set to a running job of a gang and
its worker), so the fence, the state checks and the answers of real objects are reached too.
"""

from __future__ import annotations

from collections import Counter

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode
from schemathesis.checks import (
    content_type_conformance,
    not_a_server_error,
    response_schema_conformance,
    status_code_conformance,
)

from corral.domain.status import is_allowed
from corral.store.base import JobFilter

#: generated requests per operation, way and store
MAX_EXAMPLES = 15
CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_schema_conformance]
TRACE_MARKERS = (b"Traceback (most recent call last)", b'File "/', b"site-packages/")


def assert_histories_legal(store) -> None:
    for job in store.jobs.list_jobs(JobFilter(), 5000, None):
        previous = None
        for event in store.jobs.job_events(job.id):
            assert event.from_status == previous, (job.id, event)
            assert is_allowed(event.from_status, event.to_status), (job.id, event)
            previous = event.to_status


def existing_state(server) -> dict[str, str]:
    """A registered worker running one task of a gang: the ids the aimed runs use."""
    with httpx.Client(base_url=server.url, timeout=10) as api:
        for worker in ("fuzz-1", "fuzz-2"):
            body = {"id": worker, "address": "127.0.0.1", "resources": {"cpus": 8, "memory_mb": 8192}}
            api.post("/workers/register", json=body).raise_for_status()
        gang = api.post("/jobs", json={"command": "true", "gang_size": 2}).json()
        server.run_loop("admission")
        claimed = api.get("/jobs/next", params={"worker_id": "fuzz-1"}).json()
        api.post("/jobs", json={"command": "sleep 1"}).raise_for_status()
    return {"job_id": claimed["id"], "gang_id": gang["gang_id"], "worker_id": "fuzz-1"}


def fuzz(
    server, operation, mode: GenerationMode, statuses: Counter, path_parameters=None, query=None
) -> None:
    strategy = operation.as_strategy(generation_mode=mode, path_parameters=path_parameters, query=query)

    @given(case=strategy)
    @settings(
        max_examples=MAX_EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True
    )
    def run(case) -> None:
        if case.path.endswith("/logs") and case.method == "GET" and isinstance(case.query, dict):
            case.query.pop("follow", None)  # a follow of a running job streams until it ends
        if case.path == "/jobs/next" and isinstance(case.query, dict):
            case.query.pop("wait", None)  # long-polls are bounded by the route, not worth the time
        response = case.call(base_url=server.url, timeout=15)
        statuses[(operation.label, response.status_code)] += 1
        case.validate_response(response, checks=CHECKS)
        for marker in TRACE_MARKERS:
            assert marker not in response.content, (
                f"a stack trace in {case.method} {case.path}: {response.text}"
            )

    run()


@pytest.mark.timeout(600)
def test_every_operation_holds_to_its_description(server):
    schema = schemathesis.openapi.from_url(f"{server.url}/openapi.json")
    ids = existing_state(server)
    failures = []
    statuses: Counter = Counter()
    for result in schema.get_all_operations():
        operation = result.ok()
        aimed = {
            name: ids[name] for name in ("job_id", "gang_id", "worker_id") if f"{{{name}}}" in operation.path
        }
        fenced = any(parameter.name == "attempt" for parameter in operation.iter_parameters())
        ways = [(GenerationMode.POSITIVE, None), (GenerationMode.NEGATIVE, None)]
        if aimed:
            ways.append((GenerationMode.POSITIVE, aimed))
        for mode, path_parameters in ways:
            query = {"worker_id": ids["worker_id"], "attempt": 1} if fenced and path_parameters else None
            try:
                fuzz(server, operation, mode, statuses, path_parameters, query)
            except Unsatisfiable:
                continue  # nothing to make invalid (no body, no query, a path id any string fits)
            except Exception as error:  # collect: one run reports every operation that fails
                failures.append(
                    f"{operation.label} ({mode.value}{', aimed' if path_parameters else ''}): {error}"
                )
    assert_histories_legal(server.state.store)
    print("answers by operation and status (shown with -s):")  # what the fuzz reached
    for (label, status), count in sorted(statuses.items()):
        print(f"  {label}: {status} x{count}")
    assert not failures, "\n\n".join(failures)
