"""Gangs over real HTTP: admission, rendezvous, drain, checkpoints (seeds 001 and 000)."""

from __future__ import annotations

import base64
import logging

from tests.api.conftest import error_code, register
from tests.helpers import admitted_and_running, claim, fenced, gang_workers, submit_gang


def test_admission_reserves_the_gang_and_claims_carry_the_rendezvous(api, server):
    gang, tasks = admitted_and_running(api, server)
    assert [task["id"] for task in tasks] == gang["tasks"]
    rank0, rank1 = (task["env"] for task in tasks)
    assert (rank0["RANK"], rank1["RANK"], rank0["WORLD_SIZE"]) == ("0", "1", "2")
    assert rank0["MASTER_ADDR"] == rank1["MASTER_ADDR"] == "10.0.0.1"
    assert rank0["MASTER_PORT"] == rank1["MASTER_PORT"] == "29500"
    assert rank1["GANG_PEERS"] == "10.0.0.1,10.0.0.2"
    assert rank1["CORRAL_GANG_ID"] == rank1["GANG_ID"] == gang["gang_id"]
    assert (rank1["GANG_SIZE"], rank1["GANG_INDEX"], rank1["LOCAL_RANK"]) == ("2", "1", "0")
    assert api.get(f"/gangs/{gang['gang_id']}").json()["status"] == "running"


def test_a_gang_that_cannot_fit_waits_and_says_why(api, server):
    gang_workers(api, 1)
    gang = submit_gang(api, 3)
    server.run_loop("admission")
    task = api.get(f"/jobs/{gang['tasks'][0]}").json()
    assert task["status"] == "blocked"
    why = api.get(f"/jobs/{gang['tasks'][0]}/why").json()
    assert why["status"] == "blocked"
    assert why["reasons"][0]["code"] == "unschedulable"  # 3 tasks, 1 worker: no waiting helps


def test_a_failing_rank_drains_the_gang_back_to_blocked(api, server, caplog):
    caplog.set_level(logging.INFO, logger="corral")
    gang, (rank0, rank1) = admitted_and_running(api, server)
    failed = api.post(
        f"/jobs/{rank1['id']}/fail", params=fenced(rank1), json={"exit_code": 1, "output_tail": "NCCL error"}
    )
    assert (failed.status_code, failed.json()["status"]) == (200, "preempted")
    beat = api.post(f"/jobs/{rank0['id']}/heartbeat", params=fenced(rank0)).json()
    assert beat == {"action": "preempt", "preemption_epoch": 1}
    stale = api.post(f"/jobs/{rank0['id']}/preempted", params=fenced(rank0, epoch=0))
    assert (stale.status_code, error_code(stale)) == (409, "stale_epoch")
    # the last rank's ack completes the drain in the same transaction: the answer is the job now
    acked = api.post(f"/jobs/{rank0['id']}/preempted", params=fenced(rank0, epoch=1))
    assert acked.json()["status"] == "blocked"
    server.reap()
    tasks = api.get(f"/gangs/{gang['gang_id']}").json()["tasks"]
    assert [task["status"] for task in tasks] == ["blocked", "blocked"]
    assert [task["attempts"] for task in tasks] == [0, 1]
    messages = [
        record.message for record in caplog.records if getattr(record, "gang_id", None) == gang["gang_id"]
    ]
    assert messages.index("gang drain started") < messages.index("gang drain completed")
    assert messages.count("job preempted") == 2
    metrics = api.get("/metrics").text
    assert "corral_gangs_preempted_total 1.0" in metrics
    assert 'corral_gang_preemptions_completed_total{outcome="blocked"} 1.0' in metrics
    server.run_loop("admission")
    assert api.get(f"/gangs/{gang['gang_id']}").json()["status"] == "reserved"
    assert "gang reserved" in [record.message for record in caplog.records]


def test_checkpoint_round_trip_into_the_next_attempt(api, server, settings):
    settings.checkpoint_max_bytes = 1000
    _, (rank0, rank1) = admitted_and_running(api, server)
    path = f"/jobs/{rank0['id']}/checkpoint"
    too_early = api.post(path, params=fenced(rank0, epoch=0), content=b"x")
    assert (too_early.status_code, error_code(too_early)) == (409, "not_preempting")
    api.post(f"/jobs/{rank1['id']}/fail", params=fenced(rank1), json={"exit_code": 1})
    blob = bytes([0, 255, 10, 13]) * 10
    assert api.post(path, params=fenced(rank0, epoch=1), content=b"").status_code == 400
    too_big = api.post(path, params=fenced(rank0, epoch=1), content=b"x" * 1001)
    assert (too_big.status_code, error_code(too_big)) == (413, "too_large")
    wrong_epoch = api.post(path, params=fenced(rank0, epoch=2), content=blob)
    assert (wrong_epoch.status_code, error_code(wrong_epoch)) == (409, "stale_epoch")
    assert api.post(path, params=fenced(rank0, epoch=1), content=blob).status_code == 200
    stored = api.get(path)
    assert (stored.status_code, stored.content, stored.headers["content-type"]) == (
        200,
        blob,
        "application/octet-stream",
    )
    assert api.get(f"/jobs/{rank1['id']}/checkpoint").status_code == 204
    assert api.get("/jobs/j-missing/checkpoint").status_code == 404
    assert "checkpoint" not in api.get(f"/jobs/{rank0['id']}").json()
    assert api.get(f"/jobs/{rank0['id']}").json()["has_checkpoint"] is True
    api.post(f"/jobs/{rank0['id']}/preempted", params=fenced(rank0, epoch=1))
    server.reap()
    server.run_loop("admission")
    again = claim(api, "w0")
    assert again["env"]["CORRAL_RESUME"] == "1"
    assert base64.b64decode(again["env"]["CHECKPOINT_DATA"]) == blob


def test_checkpoints_from_ranks_that_crashed_on_their_own_reach_every_rank(api, server):
    """Rank 1 crashes; rank 0 dies by itself a moment later (its collective lost its peer), before
    any heartbeat could ask it to stop. Both uploads, made without an epoch before each final
    report, are kept, and every rank of the next attempt is told where to find both."""
    gang, (rank0, rank1) = admitted_and_running(api, server)
    upload = api.post(f"/jobs/{rank1['id']}/checkpoint", params=fenced(rank1), content=b"rank1 step 3")
    assert upload.status_code == 200
    assert upload.json() == {"job_id": rank1["id"], "bytes": 12, "preemption_epoch": None, "attempt": 1}
    api.post(f"/jobs/{rank1['id']}/fail", params=fenced(rank1), json={"exit_code": 3}).raise_for_status()
    # rank 0 is preempting now; its own crash still uploads, then reports
    saved = api.post(f"/jobs/{rank0['id']}/checkpoint", params=fenced(rank0), content=b"rank0 step 3")
    assert saved.is_success
    ended = api.post(f"/jobs/{rank0['id']}/fail", params=fenced(rank0), json={"exit_code": 1})
    assert ended.json()["status"] in ("preempted", "blocked")
    late = api.post(f"/jobs/{rank0['id']}/checkpoint", params=fenced(rank0), content=b"too late")
    assert late.status_code == 409
    stale = api.post(f"/jobs/{rank0['id']}/checkpoint", params=fenced(rank0, attempt=7), content=b"x")
    assert stale.status_code == 409
    server.reap()
    server.run_loop("admission")
    again = [claim(api, f"w{index}") for index in range(2)]
    for task in again:
        assert task["env"]["CORRAL_RESUME"] == "1"
        assert task["gang_checkpoints"] == [
            {"gang_index": 0, "job_id": rank0["id"]},
            {"gang_index": 1, "job_id": rank1["id"]},
        ]
    assert api.get(f"/jobs/{rank0['id']}/checkpoint").content == b"rank0 step 3"
    assert api.get(f"/jobs/{rank1['id']}/checkpoint").content == b"rank1 step 3"
    assert api.get(f"/gangs/{gang['gang_id']}").json()["status"] == "running"


def test_a_done_job_keeps_the_checkpoint_its_attempt_wrote(api, server):
    register(api)
    job = api.post("/jobs", json={"command": "true"}).json()
    running = claim(api, "w1")
    assert running["gang_checkpoints"] == []
    assert api.post(f"/jobs/{job['id']}/checkpoint", params=fenced(running), content=b"final").is_success
    api.post(f"/jobs/{job['id']}/done", params=fenced(running)).raise_for_status()
    assert api.get(f"/jobs/{job['id']}").json()["has_checkpoint"] is True


def test_cancelling_a_running_gang_stops_every_rank(api, server):
    gang, (rank0, rank1) = admitted_and_running(api, server)
    cancelled = api.post(f"/gangs/{gang['gang_id']}/cancel").json()
    assert [task["status"] for task in cancelled["tasks"]] == ["preempting", "preempting"]
    for rank in (rank0, rank1):
        api.post(f"/jobs/{rank['id']}/preempted", params=fenced(rank, epoch=1))
    assert api.get(f"/gangs/{gang['gang_id']}").json()["status"] == "cancelled"


def test_a_watchdog_trip_drains_the_gang(api, server):
    _, (rank0, rank1) = admitted_and_running(api, server)
    tripped = api.post(
        f"/jobs/{rank0['id']}/watchdog", params=fenced(rank0), json={"kind": "stall", "detail": {}}
    )
    assert (tripped.json()["status"], tripped.json()["watchdog_retries"]) == ("preempted", 1)
    assert api.post(f"/jobs/{rank1['id']}/heartbeat", params=fenced(rank1)).json()["action"] == "preempt"


def test_single_jobs_do_not_start_on_capacity_held_for_a_waiting_gang(api, server, clock):
    register(api, "w0", gpus=2, vram_mb=1000)
    api.post("/jobs", json={"command": "x", "resources": {"gpus": 1}})
    claim(api, "w0")
    clock.advance(1)
    submit_gang(api, 2)
    server.run_loop("admission")
    clock.advance(1)
    api.post("/jobs", json={"command": "y", "resources": {"gpus": 1}})
    assert api.get("/jobs/next", params={"worker_id": "w0"}).status_code == 204


def test_a_single_job_that_ends_before_the_hold_backfills(api, server, clock):
    register(api, "w0", gpus=2, vram_mb=1000)
    api.post("/jobs", json={"command": "x", "resources": {"gpus": 1}, "walltime_s": 600})
    claim(api, "w0")
    clock.advance(1)
    submit_gang(api, 2)
    server.run_loop("admission")
    clock.advance(1)
    too_long = api.post("/jobs", json={"command": "y", "resources": {"gpus": 1}, "walltime_s": 3600}).json()
    short = api.post("/jobs", json={"command": "z", "resources": {"gpus": 1}, "walltime_s": 60}).json()
    assert claim(api, "w0")["id"] == short["id"]
    assert api.get(f"/jobs/{too_long['id']}").json()["status"] == "pending"
