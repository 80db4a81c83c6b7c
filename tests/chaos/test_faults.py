"""Faults injected into real servers and workers; the history checker after each (issue 12 item 3)."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import psutil
import pytest

from corral.client import ApiError, Client
from corral.worker.leftovers import ProcessRecords
from tests.chaos.conftest import (
    FAST_SERVER,
    assert_history,
    describe_failures,
    kill9,
    port_of,
    statuses,
    submit_with_retries,
    wait_all_terminal,
)
from tests.e2e.conftest import wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.chaos]


def test_server_kill9_mid_claim_storm_and_admission(db_url: str, start_server, start_worker):
    """kill -9 of the server while three workers claim and report as fast as they can and the
    admission cycle places gangs; a restart on the same store finishes every job exactly once."""
    server = start_server("--db", db_url, *FAST_SERVER)
    for index in range(3):
        start_worker(server.url, f"w{index}", "--cpus", "4")
    jobs = [{"command": "sleep 0.05", "resources": {"cpus": 1}} for _ in range(150)]
    jobs += [{"command": "sleep 0.2", "gang_size": 2, "resources": {"cpus": 2}} for _ in range(10)]
    with Client(server.url) as client:
        client.submit_batch(jobs)
        wait_for(lambda: list(statuses(client).values()).count("done") >= 40 or None, 30, "40 jobs done")
    kill9(server)
    time.sleep(1.0)
    server = start_server("--db", db_url, *FAST_SERVER, port=port_of(server))
    with Client(server.url) as client:
        ended = wait_all_terminal(client, 170, 60)
        assert set(ended.values()) == {"done"}, describe_failures(client, ended)
    verdict = assert_history(db_url)
    assert verdict.by_status == {"done": 170}


def test_a_server_outage_past_the_lease_runs_finished_work_once(
    sqlite_url: str, start_server, start_worker, tmp_path: Path
):
    """Issue 12's first defect: a ~16 s outage used to make finished work run twice (the worker
    gave up its ``done`` after ~15.5 s; the restarted server reaped the lapsed lease at once)."""
    server = start_server("--db", sqlite_url, *FAST_SERVER)
    start_worker(server.url, "w1", "--cpus", "4")
    once = tmp_path / "once.txt"
    with Client(server.url) as client:
        for index in range(3):
            client.submit_body({"command": f"sleep 2; echo ran-{index} >> {once}", "resources": {"cpus": 1}})
        wait_for(lambda: list(statuses(client).values()).count("running") == 3 or None, 15, "3 running")
    kill9(server)
    time.sleep(17.0)  # past the lease (6 s) and past the worker's old give-up point (~15.5 s)
    server = start_server("--db", sqlite_url, *FAST_SERVER, port=port_of(server))
    with Client(server.url) as client:
        ended = wait_all_terminal(client, 3, 30)
    assert set(ended.values()) == {"done"}
    assert sorted(once.read_text().split()) == ["ran-0", "ran-1", "ran-2"], "a finished job ran twice"
    assert_history(sqlite_url)


def test_a_worker_frozen_past_its_lease_stops_its_copy_when_thawed(
    sqlite_url: str, start_server, start_worker, tmp_path: Path
):
    """SIGSTOP a worker past its lease: the job is re-queued and run by another worker; thawed,
    the frozen worker's late reports get 409 and it stops its copy at once."""
    server = start_server("--db", sqlite_url, *FAST_SERVER)
    runs = tmp_path / "runs.txt"
    command = f'for i in $(seq 1 40); do echo "$CORRAL_ATTEMPT" >> {runs}; sleep 0.25; done'
    first = start_worker(server.url, "w1", "--cpus", "1")
    with Client(server.url) as client:
        job = client.submit_body({"command": command, "resources": {"cpus": 1}})
        wait_for(lambda: runs.exists() or None, 15, "attempt 1 to start")
        first.signal(signal.SIGSTOP)
        start_worker(server.url, "w2", "--cpus", "1")
        wait_for(lambda: "2" in runs.read_text().split() or None, 20, "attempt 2 to start on w2")
        first.signal(signal.SIGCONT)
        time.sleep(3.0)  # a heartbeat round trip or two (0.2 s) and the stop (grace 0.5 s)
        settled = runs.read_text().split().count("1")
        time.sleep(2.0)
        assert runs.read_text().split().count("1") == settled, "the thawed worker kept running its copy"
        ended = wait_all_terminal(client, 1, 30)
        assert ended == {job.id: "done"}
        assert [event.attempt for event in client.events(job.id) if event.to == "done"] == [2]
    assert "stale_attempt" in first.log() or "409" in first.log()
    assert_history(sqlite_url)


def test_a_worker_killed_with_minus_9_leaves_nothing_running_beside_attempt_two(
    sqlite_url: str, start_server, start_worker, reap_groups: list[int], tmp_path: Path
):
    """kill -9 of a worker leaves its job's process group running (parent 1): the restarted worker
    (same id) finds it from its state directory and stops it before it claims attempt 2."""
    server = start_server("--db", sqlite_url, *FAST_SERVER)
    pids = tmp_path / "pids.txt"
    worker = start_worker(server.url, "w1", "--cpus", "1")
    with Client(server.url) as client:
        # attempt 1 would run for a minute: only the restarted worker can end it in time
        command = f'echo $$ >> {pids}; if [ "$CORRAL_ATTEMPT" = 1 ]; then sleep 60; fi'
        job = client.submit_body({"command": command, "resources": {"cpus": 1}})
        wait_for(lambda: (pids.exists() and pids.read_text().strip()) or None, 15, "attempt 1 to start")
        orphan = int(pids.read_text().split()[0])
        reap_groups.append(orphan)
        # the record is written just after the job starts: a kill in that instant leaves none
        wait_for(lambda: ProcessRecords(tmp_path / "state-w1").records() or None, 5, "the process record")
        worker.process.send_signal(signal.SIGKILL)
        worker.process.wait(timeout=10)
        assert psutil.pid_exists(orphan), "the job outlived its worker (the defect's premise)"
        start_worker(server.url, "w1", "--cpus", "1")
        wait_for(lambda: not psutil.pid_exists(orphan) or None, 5, "the orphan to be stopped")
        ended = wait_all_terminal(client, 1, 30)
        assert ended == {job.id: "done"}
    assert len(pids.read_text().split()) == 2
    assert_history(sqlite_url)


# 600 in CI (seconds); CORRAL_CHAOS_SUBMITS=10000 for the full figure (about a minute)
@pytest.mark.parametrize("count", [int(os.environ.get("CORRAL_CHAOS_SUBMITS", "600"))])
def test_concurrent_submits_with_idempotency_keys_make_each_job_once(db_url: str, start_server, count: int):
    """Every submit sent twice at once (a client retry racing its first try), through two replicas
    on PostgreSQL: exactly one job per key. (10,000 in ``bench/soak.py``; fewer here, for CI time.)"""
    replicas = [start_server("--db", db_url, *FAST_SERVER)]
    if db_url.startswith("postgres"):
        replicas.append(start_server("--db", db_url, *FAST_SERVER))
    answers: dict[str, set[str]] = {}
    lock = threading.Lock()
    failures: list[str] = []

    def send(thread: int) -> None:
        clients = [Client(replica.url) for replica in replicas]
        try:
            for index in range(thread, count, 4):
                key = f"key-{index}"
                client = clients[(index + thread) % len(clients)]
                try:
                    job = submit_with_retries(client, {"command": f"echo {index}"}, key)
                except ApiError as error:
                    failures.append(f"{key}: {error}")
                    continue
                with lock:
                    answers.setdefault(key, set()).add(job.id)
        finally:
            for client in clients:
                client.close()

    # two threads per residue class: each key is sent by two threads, usually at the same time
    threads = [threading.Thread(target=send, args=(thread % 4,)) for thread in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert failures == []
    assert len(answers) == count
    assert all(len(ids) == 1 for ids in answers.values()), "a key answered with two different jobs"
    with Client(replicas[0].url) as client:
        assert len(statuses(client)) == count
    assert_history(db_url)


@pytest.mark.postgres
def test_killing_the_loop_leader_hands_every_loop_over(start_server, postgres_url: str):
    """Two replicas on PostgreSQL; kill -9 of the loop leader: the other takes every loop over
    (its advisory-lock sessions end with the process; the survivor's next tick takes each lock:
    in about the longest loop interval plus its jitter, 2 s here for the dead-worker sweep; 60 s
    for retention with its default CORRAL_RETENTION_TICK_S). How long it took is printed, not
    asserted: the wait's bound is only there so that a takeover that never comes fails."""
    from tests.helpers import leader_of

    replicas = [start_server("--db", postgres_url, *FAST_SERVER) for _ in range(2)]
    loops = ("admission", "reaper", "dead_worker_sweep", "retention")

    def one_leader_each() -> bool | None:
        return all(sum(leader_of(replica.url, loop) for replica in replicas) == 1 for loop in loops) or None

    wait_for(one_leader_each, 10, "one leader per loop")
    leader = next(replica for replica in replicas if leader_of(replica.url, "admission"))
    survivor = next(replica for replica in replicas if replica is not leader)
    killed_at = time.monotonic()
    kill9(leader)
    wait_for(lambda: all(leader_of(survivor.url, loop) for loop in loops) or None, 30, "a takeover")
    print(f"takeover of every loop after kill -9 of the leader: {time.monotonic() - killed_at:.2f} s")


def test_postgres_restarted_under_load(private_postgres, start_server, start_worker):
    """A crash-restart of PostgreSQL (``pg_ctl stop -m immediate``, then start) while two replicas
    take submits and workers claim and report: the servers reconnect, clients retry with their
    idempotency keys, and nothing is doubled or lost."""
    url = private_postgres.url
    replicas = [start_server("--db", url, *FAST_SERVER) for _ in range(2)]
    for index in range(2):
        start_worker(replicas[index].url, f"w{index}", "--cpus", "4")
    made: dict[str, str] = {}
    stop = threading.Event()
    errors: list[str] = []

    def submit_all(offset: int) -> None:
        with Client(replicas[offset].url) as client:
            for index in range(offset, 160, 2):
                if stop.is_set():
                    return
                key = f"pg-{index}"
                try:
                    job = submit_with_retries(
                        client, {"command": "sleep 0.1", "resources": {"cpus": 1}}, key, 40
                    )
                except Exception as error:
                    errors.append(f"{key}: {error}")
                    continue
                made[key] = job.id
                time.sleep(0.02)

    threads = [threading.Thread(target=submit_all, args=(offset,)) for offset in range(2)]
    for thread in threads:
        thread.start()
    with Client(replicas[0].url) as client:
        wait_for(lambda: len(made) >= 40 or None, 30, "40 submits before the restart")
        private_postgres.crash_restart()
        for thread in threads:
            thread.join(timeout=90)
        assert errors == []
        assert len(made) == 160 and len(set(made.values())) == 160
        ended = wait_all_terminal(client, 160, 90)
    assert set(ended.values()) == {"done"}
    assert_history(url)
