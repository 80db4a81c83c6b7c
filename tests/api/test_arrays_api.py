"""Job arrays and dependencies over real HTTP (API.md "Arrays and dependencies"), on both stores."""

from __future__ import annotations

from tests.api.conftest import claim, error_code, register, submit
from tests.helpers import fenced


def _finish(api, job, ok=True):
    if ok:
        response = api.post(f"/jobs/{job['id']}/done", params=fenced(job))
    else:
        response = api.post(f"/jobs/{job['id']}/fail", params=fenced(job), json={"exit_code": 1})
    assert response.status_code == 200, response.text


def test_an_array_submit_answers_its_id_and_tasks_each_with_its_index_and_env(api):
    register(api)
    array = submit(api, array="0-6:3")
    assert array["array_id"].startswith("a-") and len(array["tasks"]) == 3
    tasks = [api.get(f"/jobs/{task_id}").json() for task_id in array["tasks"]]
    assert [(task["array_id"], task["array_index"]) for task in tasks] == [
        (array["array_id"], 0),
        (array["array_id"], 3),
        (array["array_id"], 6),
    ]
    claimed = claim(api)
    assert claimed["id"] == array["tasks"][0]
    env = claimed["env"]
    assert (env["CORRAL_ARRAY_ID"], env["CORRAL_ARRAY_INDEX"], env["CORRAL_ARRAY_SIZE"]) == (
        array["array_id"],
        "0",
        "3",
    )
    listed = api.get("/jobs", params={"array_id": array["array_id"]}).json()["items"]
    assert sorted(job["id"] for job in listed) == sorted(array["tasks"])
    shown = api.get(f"/arrays/{array['array_id']}").json()
    assert shown["size"] == 3 and shown["counts"] == {"pending": 2, "running": 1}
    assert [task["array_index"] for task in shown["tasks"]] == [0, 3, 6]


def test_array_expressions_that_are_refused(api):
    for body in (
        {"array": "5-1"},
        {"array": "0-10000"},
        {"array": "1,1"},
        {"array": "0-3%0"},
        {"array": "x"},
        {"array": "0-3", "gang_size": 2},
    ):
        response = api.post("/jobs", json={"command": "true", **body})
        assert (response.status_code, error_code(response)) == (400, "invalid_request"), body
    assert len(submit(api, array="1,5,7%2")["tasks"]) == 3
    assert len(submit(api, array="0-9999")["tasks"]) == 10_000


def test_the_throttle_holds_in_the_claim(api):
    register(api, "w1", cpus=64)
    array = submit(api, array="0-3%2")
    first = claim(api)
    second = claim(api)
    running = {first["id"], second["id"]}
    assert api.get("/jobs/next", params={"worker_id": "w1"}).status_code == 204  # two already run
    assert api.get(f"/arrays/{array['array_id']}").json()["counts"] == {"running": 2, "pending": 2}
    _finish(api, first)
    third = claim(api)
    assert third["array_id"] == array["array_id"] and third["id"] not in running


def test_claim_many_starts_no_more_than_the_throttle(api):
    register(api, "w1", cpus=64)
    array = submit(api, array="0-5%2")
    claimed = api.get("/jobs/next", params={"worker_id": "w1", "max": 8}).json()["items"]
    assert len(claimed) == 2
    assert api.get("/jobs/next", params={"worker_id": "w1", "max": 8}).status_code == 204
    assert api.get(f"/arrays/{array['array_id']}").json()["counts"] == {"running": 2, "pending": 4}


def test_cancel_an_array_cancels_every_task_not_ended(api):
    register(api)
    array = submit(api, array="0-2")
    running = claim(api)
    _finish(api, running)
    cancelled = api.post(f"/arrays/{array['array_id']}/cancel")
    assert cancelled.status_code == 200, cancelled.text
    assert cancelled.json()["counts"] == {"done": 1, "cancelled": 2}
    again = api.post(f"/arrays/{array['array_id']}/cancel")
    assert (again.status_code, error_code(again)) == (409, "already_terminal")
    missing = api.get("/arrays/a-0000000000000000")
    assert (missing.status_code, error_code(missing)) == (404, "not_found")


def test_a_job_after_an_array_waits_until_every_task_is_done(api, server):
    register(api, "w1", cpus=64)
    array = submit(api, array="0-1")
    after = submit(api, command="echo after", after=[{"id": array["array_id"], "when": "ok"}])
    assert (after["status"], after["reason"]["code"]) == ("pending", "dependency")
    assert after["after"] == [{"id": array["array_id"], "when": "ok"}]
    first, second = claim(api), claim(api)
    assert api.get("/jobs/next", params={"worker_id": "w1"}).status_code == 204  # the dependent waits
    _finish(api, first)
    server.run_loop("dependencies")
    assert api.get(f"/jobs/{after['id']}").json()["reason"]["code"] == "dependency"
    _finish(api, second)
    server.run_loop("dependencies")
    released = api.get(f"/jobs/{after['id']}").json()
    assert (released["status"], released["reason"]["code"]) == ("pending", "queued")
    assert claim(api)["id"] == after["id"]


def test_a_condition_that_can_no_longer_hold_cancels_the_job(api, server):
    register(api, "w1", cpus=64)
    failing = submit(api, max_retries=1)
    on_ok = submit(api, after=[{"id": failing["id"], "when": "ok"}])
    on_notok = submit(api, after=[{"id": failing["id"], "when": "notok"}])
    on_any = submit(api, after=[{"id": failing["id"], "when": "any"}])
    _finish(api, claim(api), ok=False)
    assert api.get(f"/jobs/{failing['id']}").json()["status"] == "failed"
    server.run_loop("dependencies")
    cancelled = api.get(f"/jobs/{on_ok['id']}").json()
    assert (cancelled["status"], cancelled["reason"]["code"]) == ("cancelled", "dependency_never_satisfied")
    for job in (on_notok, on_any):
        assert api.get(f"/jobs/{job['id']}").json()["reason"]["code"] == "queued"
    events = api.get(f"/jobs/{on_ok['id']}/events").json()["items"]
    assert events[-1]["reason"]["code"] == "dependency_never_satisfied"


def test_an_unknown_dependency_is_refused(api):
    response = api.post("/jobs", json={"command": "true", "after": [{"id": "j-nope", "when": "ok"}]})
    assert (response.status_code, error_code(response)) == (400, "invalid_request")
    assert "j-nope" in response.json()["error"]["message"]
    bad_when = api.post("/jobs", json={"command": "true", "after": [{"id": "j-nope", "when": "maybe"}]})
    assert bad_when.status_code == 400


def test_the_job_page_and_why_show_the_array_and_the_conditions(api):
    array = submit(api, array="0-1%1")
    after = submit(api, after=[{"id": array["array_id"], "when": "ok"}])
    task_page = api.get(f"/ui/jobs/{array['tasks'][1]}").text
    assert f'Task 1 of array <a href="/ui/jobs?array_id={array["array_id"]}">' in task_page
    assert "2 tasks, at most 1 at once" in task_page
    after_page = api.get(f"/ui/jobs/{after['id']}").text
    assert (
        f'<code>ok</code> <a href="/ui/jobs?array_id={array["array_id"]}">{array["array_id"]}</a> (waiting)'
        in after_page
    )
    why = api.get(f"/jobs/{after['id']}/why").json()
    assert why["reasons"][0]["code"] == "dependency"
    assert f"ok:{array['array_id']}" in why["reasons"][0]["message"]


def test_a_batch_may_hold_an_array_and_a_job_after_an_earlier_one(api):
    earlier = submit(api)
    response = api.post(
        "/jobs/batch",
        json={
            "jobs": [
                {"command": "true", "array": "0-2"},
                {"command": "true", "after": [{"id": earlier["id"]}]},
            ]
        },
    )
    assert response.status_code == 201, response.text
    array, job = response.json()["items"]
    assert array["array_id"].startswith("a-") and len(array["tasks"]) == 3
    assert (job["after"], job["reason"]["code"]) == ([{"id": earlier["id"], "when": "ok"}], "dependency")
    too_many = api.post(
        "/jobs/batch", json={"jobs": [{"command": "true", "array": "0-9999"}, {"command": "true"}]}
    )
    assert (too_many.status_code, error_code(too_many)) == (400, "invalid_request")


def test_a_jobs_end_wakes_the_dependency_loop_only_while_a_dependent_may_wait(api, server):
    """With nobody waiting on conditions a job's end does not wake the dependency loop (a pass
    and, on PostgreSQL, a lock round trip per job in a storm); a submit with conditions does,
    and so do the ends after it until a pass finds nobody waiting again."""
    woken: list[str] = []
    server.state.wake_loop = woken.append
    register(api, "w1", cpus=64)
    submit(api)
    server.run_loop("dependencies")  # nobody waits: the flag the server starts with is cleared
    woken.clear()
    _finish(api, claim(api))
    assert "dependencies" not in woken, "nobody waits on conditions: no wake"
    first = submit(api)
    dependent = submit(api, after=[{"id": first["id"], "when": "ok"}])
    assert woken.count("dependencies") == 1, "the dependent's submit wakes the loop"
    _finish(api, claim(api))
    assert woken.count("dependencies") == 2, "while it waits, a job's end wakes the loop"
    server.run_loop("dependencies")
    assert api.get(f"/jobs/{dependent['id']}").json()["reason"]["code"] == "queued"
    _finish(api, claim(api))
    assert woken.count("dependencies") == 2, "settled: nobody waits, an end wakes nothing"
