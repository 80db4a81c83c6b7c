"""``corral submit --array``/``--after`` and the SDK's ``submit(array=, after=)`` against a live
server (API.md "Arrays and dependencies"), on SQLite and PostgreSQL."""

from __future__ import annotations

import json
from typing import Any

import pytest

from corral.client import Client
from corral.protocol.answers import ArraySubmitted
from tests.helpers import corral


@pytest.fixture
def client(server: Any) -> Any:
    with Client(server.url) as sdk:
        yield sdk


def test_submit_array_prints_the_one_array_id_and_after_names_the_conditions(server, client, capsys):
    code, out, err = corral(server, capsys, "submit", "--array", "0-3%2", "--", "echo", "task")
    assert code == 0, err
    array_id = out.strip()
    assert array_id.startswith("a-") and "\n" not in array_id
    array = client.array(array_id)
    assert (array.size, array.throttle, array.counts) == (4, 2, {"pending": 4})
    assert [task.array_index for task in array.tasks] == [0, 1, 2, 3]
    code, out, err = corral(
        server, capsys, "submit", "--after", f"ok:{array_id},any:{array.tasks[0].id}", "--", "true"
    )
    assert code == 0, err
    job = client.get_job(out.strip())
    assert [(item.id, item.when) for item in job.after] == [(array_id, "ok"), (array.tasks[0].id, "any")]
    assert (job.status, job.reason.code if job.reason else None) == ("pending", "dependency")


def test_submit_after_an_unknown_id_exits_1_naming_after(server, capsys):
    code, out, err = corral(server, capsys, "submit", "--after", "ok:j-nothing", "--", "true")
    assert (code, out) == (1, "")
    assert err.startswith("corral: invalid_request: ") and "after" in err


def test_the_sdk_submits_arrays_and_conditions(client):
    array = client.submit_body({"command": "true"}, array="1,5,7")
    assert isinstance(array, ArraySubmitted) and len(array.tasks) == 3
    job = client.submit_body(
        {"command": "true"}, after=[f"notok:{array.array_id}", {"id": array.tasks[0], "when": "any"}]
    )
    assert [(item.id, item.when) for item in job.after] == [
        (array.array_id, "notok"),
        (array.tasks[0], "any"),
    ]
    listed = client.list_jobs_page(array_id=array.array_id).items
    assert sorted(task.id for task in listed) == sorted(array.tasks)
    cancelled = client.cancel_array(array.array_id)
    assert cancelled.counts == {"cancelled": 3}


def test_corral_jobs_lists_the_tasks_of_an_array(server, client, capsys):
    array = client.submit_body({"command": "true"}, array="0-1")
    client.submit_body({"command": "true"})
    code, out, err = corral(server, capsys, "jobs", "--array", array.array_id, "--json")
    assert code == 0, err
    assert sorted(item["id"] for item in json.loads(out)["items"]) == sorted(array.tasks)
