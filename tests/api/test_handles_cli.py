"""Issue 23 item 3, the CLI side, against a live server: a gang's or an array's id taken wherever a
job's is (``show``, ``why``, ``events``, ``logs``, ``cancel``), ``unschedulable`` read the same way
by ``jobs`` and ``why``, ``jobs --wide``, and ``submit --wait`` giving up with exit 4 on work no
registered worker could ever hold."""

from __future__ import annotations

import json
import threading

from corral.cli import exit_codes
from tests.api.conftest import claim, register, submit
from tests.helpers import corral, send


def test_the_jobs_list_and_why_say_unschedulable_alike_and_wide_shows_it_whole(server, api, capsys):
    register(api, "w1", gpus=8)
    job = submit(api, resources={"gpus": 64}, name="too-big")
    code, out, _ = corral(server, capsys, "jobs")
    assert code == 0
    (line,) = [row for row in out.splitlines() if job["id"] in row]
    assert "unschedulable: no active worker can ever" in line and line.endswith("…")
    assert "waiting for a worker with free capacity" not in out
    code, wide, _ = corral(server, capsys, "jobs", "--wide")
    (line,) = [row for row in wide.splitlines() if job["id"] in row]
    assert line.endswith("unschedulable: " + job["reason"]["message"])
    code, why, _ = corral(server, capsys, "why", job["id"])
    assert why.splitlines()[1] == "  unschedulable: " + job["reason"]["message"]


def test_submit_wait_exits_4_once_unschedulable_for_the_time_given(server, api, capsys):
    register(api, "w1", gpus=8)
    for flags in (["--gpus", "64"], ["--gang-size", "3", "--gpus", "8"], ["--array", "0-2", "--gpus", "9"]):
        code, out, err = corral(
            server, capsys, "submit", *flags, "--wait", "--unschedulable-after", "0", "--", "true"
        )
        assert code == exit_codes.UNSCHEDULABLE == 4, err
        handle = err.splitlines()[0]
        (line,) = out.splitlines()  # the id on standard output as a finished wait prints it
        assert line.startswith(f"{handle}: "), out
        assert "unschedulable" in err and f"corral cancel {handle}" in err
    # the work stays queued: the wait gave up, nothing was cancelled
    assert {job["status"] for job in api.get("/jobs").json()["items"]} == {"pending", "blocked"}


def test_submit_wait_json_prints_the_job_before_giving_up(server, api, capsys):
    register(api, "w1", gpus=8)
    code, out, _ = corral(
        server, capsys, "submit", "--gpus", "64", "--wait", "--json", "--unschedulable-after", "0", "--", "x"
    )
    assert code == 4 and json.loads(out)["reason"]["code"] == "unschedulable"


def test_a_job_that_fits_is_waited_for_to_its_end(server, api, capsys):
    """``--unschedulable-after 0`` gives up only on work that could never run: a job that fits is
    waited for until it ends (here a stand-in worker claims it and reports it done)."""
    register(api, "w1", gpus=8)
    stop = threading.Event()

    def worker() -> None:
        while not stop.is_set():
            response = api.get("/jobs/next", params={"worker_id": "w1"})
            if response.status_code == 200:
                job = response.json()
                params = {"worker_id": "w1", "attempt": job["attempt"]}
                api.post(f"/jobs/{job['id']}/done", params=params, json={}).raise_for_status()
                return
            stop.wait(0.05)

    claimer = threading.Thread(target=worker)
    claimer.start()
    try:
        code, out, err = corral(
            server, capsys, "submit", "--gpus", "8", "--wait", "--unschedulable-after", "0", "--", "true"
        )
    finally:
        stop.set()
        claimer.join()
    assert code == 0, err
    assert out.strip().endswith(": done")


def test_the_unschedulable_count_starts_over_when_the_work_could_run_again():
    from corral.cli.submit import Unschedulable

    waiting = {"status": "pending", "reason": {"code": "unschedulable", "message": "m"}}
    queued = {"status": "pending", "reason": {"code": "queued", "message": "q"}}
    count = Unschedulable(after_s=3600)
    assert not count.seen([waiting])
    assert not count.seen([queued]) and count.reason is None
    assert Unschedulable(after_s=0).seen([waiting])
    assert not Unschedulable(after_s=0).seen([{**waiting, "status": "cancelled"}])


def test_help_documents_exit_code_4(capsys):
    from corral.cli.main import main

    assert main(["--help"]) == 0
    assert "4  `submit --wait`: the job has been unschedulable" in capsys.readouterr().out
    assert main(["submit", "--help"]) == 0
    assert "--unschedulable-after SECONDS" in capsys.readouterr().out


def test_an_array_id_is_taken_by_show_why_events_logs_and_cancel(server, api, capsys):
    register(api, "w1", gpus=0)
    code, out, err = corral(server, capsys, "submit", "--array", "0-2", "--", "echo", "task")
    assert code == 0, err
    array_id = out.strip()
    tasks = api.get("/jobs", params={"array_id": array_id}).json()["items"]
    running = claim(api)  # task 0
    send(api, running, 0, b"hello from 0\nno newline")

    code, out, err = corral(server, capsys, "show", array_id)
    assert code == 0, err
    assert f"array_id: {array_id}" in out and "size: 3" in out and "counts: 2 pending, 1 running" in out
    assert [line.split()[:2] for line in out.splitlines() if "j-" in line] == [
        ["0", tasks[0]["id"]], ["1", tasks[1]["id"]], ["2", tasks[2]["id"]]
    ]  # fmt: skip
    shown = json.loads(corral(server, capsys, "show", array_id, "--json")[1])
    assert shown["counts"] == {"pending": 2, "running": 1}

    code, out, _ = corral(server, capsys, "why", array_id)
    assert code == 0
    assert (
        out.splitlines()[0]
        == f"{array_id}: running (2 pending, 1 running) (reasons of task {tasks[1]['id']})"
    )
    why = json.loads(corral(server, capsys, "why", array_id, "--json")[1])
    assert (why["array_id"], why["status"], why["job_id"]) == (array_id, "running", tasks[1]["id"])

    code, out, _ = corral(server, capsys, "events", array_id)
    assert code == 0 and out.splitlines()[0].split()[:2] == ["JOB", "AT"]
    assert {line.split()[0] for line in out.splitlines()[1:]} == {task["id"] for task in tasks}
    events = json.loads(corral(server, capsys, "events", array_id, "--json")[1])["items"]
    assert [event["array_index"] for event in events if event["to"] == "running"] == [0]

    code, out, _ = corral(server, capsys, "logs", array_id)
    assert (code, out) == (0, "[index 0] hello from 0\n[index 0] no newline\n")

    code, out, err = corral(server, capsys, "cancel", array_id)
    assert code == 0, err
    assert out.strip().startswith(f"{array_id}: cancelling: stopping 1 running task(s) of 3")
    assert "preempting" not in out
    code, _, err = corral(server, capsys, "cancel", "a-unknown")
    assert code == 1 and err.startswith("corral: not_found: ")


def test_a_gang_id_is_taken_by_show_why_and_events(server, api, capsys):
    register(api, "w1", gpus=8)
    gang = submit(api, gang_size=2, resources={"gpus": 8})
    code, out, _ = corral(server, capsys, "show", gang["gang_id"])
    assert code == 0 and f"gang_id: {gang['gang_id']}" in out and "status: blocked" in out
    code, out, _ = corral(server, capsys, "why", gang["gang_id"])
    assert out.splitlines()[0] == f"{gang['gang_id']}: blocked (reasons of task {gang['tasks'][0]})"
    assert out.splitlines()[1].startswith("  unschedulable: needs 2 tasks of 8 GPU(s) at once")
    code, out, _ = corral(server, capsys, "events", gang["gang_id"])
    assert {line.split()[0] for line in out.splitlines()[1:]} == set(gang["tasks"])


def test_unknown_handles_answer_not_found(server, capsys):
    for command in ("show", "why", "events", "logs"):
        for handle in ("j-nope", "g-nope", "a-nope"):
            code, out, err = corral(server, capsys, command, handle)
            assert (code, out) == (1, ""), (command, handle)
            assert err.startswith("corral: not_found: "), (command, handle, err)


def test_cancelling_a_waiting_array_cancels_every_task_at_once(server, api, capsys):
    code, out, _ = corral(server, capsys, "submit", "--array", "0-2", "--", "true")
    array_id = out.strip()
    code, out, err = corral(server, capsys, "cancel", array_id)
    assert (code, out, err) == (0, f"{array_id}: cancelled (3 tasks)\n", "")
    code, out, _ = corral(server, capsys, "show", array_id)
    assert "counts: 3 cancelled" in out
