"""``corral logs`` in-process against a live server: a job's output, an attempt's, a gang's by rank,
and a follow that ends with the attempt."""

from __future__ import annotations

import threading
import time

from tests.api.conftest import claim, register, submit
from tests.helpers import admitted_and_running, corral, send


def report(api, job, what="done"):
    params = {"worker_id": job["worker_id"], "attempt": job["attempt"]}
    api.post(
        f"/jobs/{job['id']}/{what}", params=params, json={} if what == "done" else {"exit_code": 1}
    ).raise_for_status()


def test_logs_prints_the_latest_attempt_or_the_one_asked_for(server, api, capsys):
    register(api)
    submit(api, max_retries=3)
    first = claim(api)
    send(api, first, 0, b"attempt one\n")
    report(api, first, "fail")
    second = claim(api)
    send(api, second, 0, b"attempt two\n")
    assert corral(server, capsys, "logs", second["id"]) == (0, "attempt two\n", "")
    assert corral(server, capsys, "logs", second["id"], "--attempt", "1") == (0, "attempt one\n", "")
    code, _, err = corral(server, capsys, "logs", "j-unknown")
    assert code == 1 and "not_found" in err
    assert corral(server, capsys, "logs", second["id"], "--attempt", "0")[0] == 2


def test_a_dropped_start_is_noted_on_stderr(server, settings, api, capsys):
    settings.log_max_bytes = 4
    register(api)
    submit(api)
    job = claim(api)
    send(api, job, 0, b"abcdef\n")
    code, out, err = corral(server, capsys, "logs", job["id"])
    assert (code, out) == (0, "def\n")
    assert "3 bytes" in err and "dropped" in err


def test_a_gang_prints_each_line_with_its_rank(server, api, capsys):
    gang, tasks = admitted_and_running(api, server)
    for task in reversed(tasks):
        send(api, task, 0, f"hello from {task['gang_index']}\nsecond line".encode())
    code, out, _ = corral(server, capsys, "logs", gang["gang_id"])
    assert code == 0
    assert out.splitlines() == [
        "[rank 0] hello from 0", "[rank 0] second line", "[rank 1] hello from 1", "[rank 1] second line"
    ]  # fmt: skip


def test_follow_prints_new_output_and_ends_with_the_attempt(server, api, capsys):
    register(api)
    submit(api)
    job = claim(api)
    send(api, job, 0, b"one\n")

    def later():
        time.sleep(0.8)
        send(api, job, 4, b"two\n")
        time.sleep(0.3)
        report(api, job)

    writer = threading.Thread(target=later)
    writer.start()
    code, out, _ = corral(server, capsys, "logs", job["id"], "-f")
    writer.join()
    assert (code, out) == (0, "one\ntwo\n")  # it returned: the follow ended with the job


def test_follow_of_a_gang_prefixes_ranks_and_ends_when_every_rank_ends(server, api, capsys):
    gang, tasks = admitted_and_running(api, server)
    send(api, tasks[0], 0, b"zero starts\n")

    def later():
        time.sleep(0.6)
        send(api, tasks[1], 0, b"one says hi\npartial")
        time.sleep(0.3)
        for task in tasks:
            report(api, task)

    writer = threading.Thread(target=later)
    writer.start()
    code, out, _ = corral(server, capsys, "logs", gang["gang_id"], "-f")
    writer.join()
    assert code == 0
    assert sorted(out.splitlines()) == ["[rank 0] zero starts", "[rank 1] one says hi", "[rank 1] partial"]
