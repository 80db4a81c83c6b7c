"""Class-based preemption over real HTTP (seed 003): the planner in the admission cycle, the
checkpoint phase in the heartbeat answers, the victim's re-queue, the preemptor held its room."""

from __future__ import annotations

import logging

import httpx

from corral.testing.server import ServerThread
from tests.api.conftest import register, submit
from tests.helpers import POLICY


def fenced(job: dict, **extra: object) -> dict:
    return {"worker_id": job["worker_id"], "attempt": job["attempt"], **extra}


def claim(api: httpx.Client, worker_id: str) -> httpx.Response:
    return api.get("/jobs/next", params={"worker_id": worker_id})


def beat(api: httpx.Client, job: dict, **body: object) -> dict:
    response = api.post(f"/jobs/{job['id']}/heartbeat", params=fenced(job), json=body or None)
    assert response.status_code == 200, response.text
    return response.json()


def job_of(api: httpx.Client, job_id: str) -> dict:
    return api.get(f"/jobs/{job_id}").json()


def low_job_running(api: httpx.Client, clock, worker_id: str = "w1", **fields: object) -> dict:
    low = submit(api, resources={"gpus": 1}, preemption_class=2, **fields)
    running = claim(api, worker_id)
    assert running.status_code == 200 and running.json()["id"] == low["id"]
    clock.advance(60)
    return running.json()


def test_a_class_7_job_takes_a_class_2_jobs_gpu_which_checkpoints_stops_and_resumes(
    api: httpx.Client, server: ServerThread, clock
) -> None:
    register(api, "w1", gpus=1, vram_mb=1000)
    low = low_job_running(api, clock, checkpoint="auto")
    high = submit(api, resources={"gpus": 1}, preemption_class=7)
    server.run_loop("admission")

    victim = job_of(api, low["id"])
    assert victim["status"] == "preempting"
    assert victim["reason"]["code"] == "preempted_priority"
    assert high["id"] in victim["reason"]["message"] and "checkpointing first" in victim["reason"]["message"]
    preemptor = job_of(api, high["id"])
    assert (preemptor["status"], preemptor["worker_id"], preemptor["gpu_indices"]) == ("reserved", "w1", [0])
    assert claim(api, "w1").status_code == 204, "the preemptor waits until its victim has left the GPU"
    assert (victim["preempted_for"], victim["checkpoint_failures"]) == (high["id"], 0)
    page = api.get(f"/ui/jobs/{low['id']}").text
    assert f"Being stopped for <code>{high['id']}</code>" in page, "the dashboard says it too"

    answer = beat(api, low)
    assert answer["action"] == "checkpoint" and answer["preemption_epoch"] == 1
    assert 599 <= answer["deadline_s"] <= 600
    clock.advance(7)
    upload = api.post(f"/jobs/{low['id']}/checkpoint", params=fenced(low, epoch=1), content=b"step 41")
    assert upload.status_code == 200, upload.text
    assert beat(api, low) == {"action": "preempt", "preemption_epoch": 1}
    api.post(f"/jobs/{low['id']}/preempted", params=fenced(low, epoch=1)).raise_for_status()

    requeued = job_of(api, low["id"])
    assert requeued["status"] == "pending"
    assert (requeued["preempted_count"], requeued["has_checkpoint"]) == (1, True)
    assert requeued["attempts"] == 0, "a preemption never spends a retry"
    assert requeued["submitted_at"] == low["submitted_at"], "its place in the queue is kept"
    events = api.get(f"/jobs/{low['id']}/events").json()["items"]
    assert [event["to"] for event in events] == ["pending", "running", "preempting", "preempted", "pending"]
    assert events[-1]["reason"]["code"] == "preempted_requeued"

    started = claim(api, "w1")
    assert started.status_code == 200 and started.json()["id"] == high["id"], (
        "the freed GPU went to the preemptor"
    )
    metrics = api.get("/metrics").text
    assert 'corral_preemptions_total{pool="default",reason="priority"} 1.0' in metrics
    assert "corral_preemption_victim_requeue_total 1.0" in metrics
    assert "corral_preemption_checkpoint_duration_seconds_count 1.0" in metrics
    assert "corral_preemption_checkpoint_duration_seconds_sum 7.0" in metrics

    api.post(f"/jobs/{high['id']}/done", params=fenced(started.json())).raise_for_status()
    resumed = claim(api, "w1").json()
    assert resumed["id"] == low["id"]
    assert resumed["env"]["CORRAL_RESUME"] == "1"
    assert api.get(f"/jobs/{low['id']}/checkpoint").content == b"step 41"


def test_the_checkpoint_phase_is_extended_once_deferred_on_request_then_ends_without_one(
    api: httpx.Client, server: ServerThread, clock, settings
) -> None:
    settings.checkpoint_timeout_s = 10
    settings.max_deferral_s = 5
    register(api, "w1", gpus=1, vram_mb=1000)
    low = low_job_running(api, clock, checkpoint="manual")
    submit(api, resources={"gpus": 1}, preemption_class=7)
    server.run_loop("admission")
    assert beat(api, low)["deadline_s"] == 10
    clock.advance(11)
    assert beat(api, low)["deadline_s"] == 4, "still beating at the deadline: one extension of 50%"
    assert beat(api, low, defer_s=30)["deadline_s"] == 5, "the job asked for more: 5 s at most in all"
    assert beat(api, low, defer_s=30)["deadline_s"] == 5, "nothing more to grant"
    clock.advance(6)
    assert beat(api, low) == {"action": "preempt", "preemption_epoch": 1}
    assert job_of(api, low["id"])["reason"]["code"] == "checkpoint_timed_out"
    assert "corral_preemption_failed_checkpoint_total 1.0" in api.get("/metrics").text
    api.post(f"/jobs/{low['id']}/preempted", params=fenced(low, epoch=1)).raise_for_status()
    why = api.get(f"/jobs/{low['id']}/why").json()
    assert "checkpoint_failed" in [reason["code"] for reason in why["reasons"]]


def test_the_force_drain_never_cuts_a_checkpoint_phase_short(
    api: httpx.Client, server: ServerThread, clock, settings
) -> None:
    settings.checkpoint_timeout_s = 100
    settings.preempt_timeout_s = 45
    settings.heartbeat_timeout_s = 1000
    register(api, "w1", gpus=1, vram_mb=1000)
    low = low_job_running(api, clock, checkpoint="auto")
    submit(api, resources={"gpus": 1}, preemption_class=7)
    server.run_loop("admission")
    clock.advance(60)  # past the preempt timeout, within the checkpoint window: the worker is silent
    server.run_loop("reaper")
    assert job_of(api, low["id"])["status"] == "preempting"
    clock.advance(100)  # the window (100 s) and the preempt timeout after it (45 s) are over
    server.run_loop("reaper")
    requeued = job_of(api, low["id"])
    assert (requeued["status"], requeued["preempted_count"]) == ("pending", 1)
    assert "corral_preemption_failed_checkpoint_total 1.0" in api.get("/metrics").text


def test_work_claimed_while_a_pass_waits_to_read_is_weighed_from_its_start(
    api: httpx.Client, server: ServerThread, clock
) -> None:
    """A pass on a busy server waits for the planner and reads for a while; the three jobs here
    are claimed in that time (as they were in a loaded end-to-end run). The pass decides at a time
    read after its snapshot, so the newest two are still the cheapest victims: decided at a time
    read before, all three had started "later" and looked free alike, and the oldest was taken."""
    for index in range(4):
        register(api, f"w{index}", gpus=1, vram_mb=1000)
    lows = [submit(api, resources={"gpus": 1}, preemption_class=2) for _ in range(3)]
    submit(api, gang_size=3, resources={"gpus": 1}, preemption_class=7)
    store = server.state.store
    read_inputs = store.gangs.admission_inputs

    claimed: list[str] = []  # oldest first

    def claimed_meanwhile():
        for index in range(3):
            clock.advance(60)
            (started,) = store.claims.claim_many(f"w{index}", clock.now(), POLICY, 1)
            claimed.append(started.id)
        clock.advance(1)
        return read_inputs()

    store.gangs.admission_inputs = claimed_meanwhile
    try:
        server.run_loop("admission")
    finally:
        store.gangs.admission_inputs = read_inputs
    stopping = [job_id for job_id in claimed if job_of(api, job_id)["status"] == "preempting"]
    assert sorted(claimed) == sorted(low["id"] for low in lows)
    assert stopping == claimed[1:], "the newest (cheapest) two"


def test_a_gang_of_three_is_made_room_for_by_exactly_the_minimal_set(
    api: httpx.Client, server: ServerThread, clock, caplog
) -> None:
    caplog.set_level(logging.INFO, logger="corral")
    for index in range(4):
        register(api, f"w{index}", gpus=1, vram_mb=1000)
    lows = [low_job_running(api, clock, f"w{index}") for index in range(3)]  # w3 stays idle
    gang = api.post(
        "/jobs", json={"command": "train", "gang_size": 3, "resources": {"gpus": 1}, "preemption_class": 7}
    ).json()
    server.run_loop("admission")
    stopping = [low for low in lows if job_of(api, low["id"])["status"] == "preempting"]
    assert len(stopping) == 2, "one task fits on the idle worker: two victims, not three"
    assert stopping == lows[1:], "the newest (cheapest) two"
    tasks = api.get(f"/gangs/{gang['gang_id']}").json()["tasks"]
    assert {task["status"] for task in tasks} == {"reserved"}
    assert sorted(task["worker_id"] for task in tasks) == ["w1", "w2", "w3"]
    told = [
        record
        for record in caplog.records
        if record.message == "gang reserved" and getattr(record, "gang_id", None) == gang["gang_id"]
    ]
    assert len(told) == 1, "a gang reserved by a preemption is told as admission's are"
    assert (told[0].gang_size, sorted(told[0].victims)) == (3, sorted(low["id"] for low in stopping))
    assert "corral_gangs_reserved_total 1.0" in api.get("/metrics").text, "and counted"
    assert claim(api, "w3").json()["gang_id"] == gang["gang_id"], "its room is free already"
    assert claim(api, "w1").status_code == 204, "w1's victim has not left yet"
    for low in stopping:
        api.post(f"/jobs/{low['id']}/fail", params=fenced(low), json={"exit_code": 143}).raise_for_status()
    assert claim(api, "w1").json()["gang_id"] == gang["gang_id"]
    assert job_of(api, lows[0]["id"])["status"] == "running", "the oldest low job was never touched"


def test_nothing_is_preempted_for_nothing_and_why_says_what_blocks(
    api: httpx.Client, server: ServerThread, clock
) -> None:
    register(api, "w1", gpus=1, vram_mb=1000)
    protected = submit(api, resources={"gpus": 1}, preemption_class=7, checkpoint="none")
    claim(api, "w1").raise_for_status()
    waiting = submit(api, resources={"gpus": 1}, preemption_class=9)
    server.run_loop("admission")
    assert job_of(api, protected["id"])["status"] == "running"
    reasons = api.get(f"/jobs/{waiting['id']}/why").json()["reasons"]
    assert "no_victim_set" in [reason["code"] for reason in reasons]
    server.run_loop("admission")
    assert job_of(api, protected["id"])["status"] == "running", "and no loop either"


def test_sensitive_pools_are_never_preempted_and_borrowed_capacity_is_reclaimed(
    api: httpx.Client, server: ServerThread, clock
) -> None:
    for path, body in (("secure", {"kind": "sensitive"}), ("guest", {})):
        assert api.put(f"/pools/{path}", json=body).status_code == 200
    register(api, "w1", gpus=1, vram_mb=1000)
    secure = low_job_running(api, clock, "w1", pool="secure")
    # Guaranteed only now: a sensitive pool's job never starts on capacity another pool is
    # guaranteed and not using (it could never be taken back).
    assert api.put("/pools/home", json={"guarantee": {"gpus": 1}}).status_code == 200
    urgent = submit(api, resources={"gpus": 1}, preemption_class=9, pool="guest", checkpoint="auto")
    server.run_loop("admission")
    assert job_of(api, secure["id"])["status"] == "running", "class 2, but in a sensitive pool"
    assert "no_victim_set" in [r["code"] for r in api.get(f"/jobs/{urgent['id']}/why").json()["reasons"]]
    api.post(f"/jobs/{urgent['id']}/cancel").raise_for_status()
    # "home" is below its guarantee of one GPU with work waiting: "guest" borrows w2, same class.
    register(api, "w2", gpus=1, vram_mb=1000)
    guest = submit(api, resources={"gpus": 1}, preemption_class=5, pool="guest")
    claim(api, "w2").raise_for_status()
    clock.advance(60)
    owner = submit(api, resources={"gpus": 1}, preemption_class=5, pool="home")
    server.run_loop("admission")
    stopped = job_of(api, guest["id"])
    assert stopped["status"] == "preempting"
    assert stopped["reason"]["code"] == "preempted_reclaim"
    assert owner["id"] in stopped["reason"]["message"]
    assert "to reclaim its pool's guaranteed capacity" in stopped["reason"]["message"]
    assert job_of(api, owner["id"])["worker_id"] == "w2"
    assert 'corral_preemptions_total{pool="guest",reason="reclaim"} 1.0' in api.get("/metrics").text


def test_work_no_preemption_could_take_back_is_not_placed_on_borrowed_capacity(
    api: httpx.Client, server: ServerThread, clock
) -> None:
    assert api.put("/pools/home", json={"guarantee": {"gpus": 1}}).status_code == 200
    register(api, "w1", gpus=1, vram_mb=1000)
    register(api, "w2", gpus=1, vram_mb=1000)
    locked = {"resources": {"gpus": 1}, "preemption_class": 7, "checkpoint": "none", "pool": "guest"}
    first = submit(api, **locked)
    assert claim(api, "w1").json()["id"] == first["id"], "one GPU is left for home's guarantee"
    second = submit(api, **locked)
    assert claim(api, "w2").status_code == 204, "it would take the GPU home is guaranteed"
    server.run_loop("admission")
    reasons = [reason["code"] for reason in api.get(f"/jobs/{second['id']}/why").json()["reasons"]]
    assert "borrowing_refused" in reasons
    borrower = submit(api, resources={"gpus": 1}, preemption_class=5, pool="guest")
    assert claim(api, "w2").json()["id"] == borrower["id"], "preemptible work may borrow"
    clock.advance(30)
    owner = submit(api, resources={"gpus": 1}, preemption_class=5, pool="home")
    server.run_loop("admission")
    assert job_of(api, borrower["id"])["status"] == "preempting", "and is reclaimed"
    assert job_of(api, first["id"])["status"] == "running"
    assert job_of(api, owner["id"])["worker_id"] == "w2"


def test_a_sensitive_pools_single_job_is_not_placed_on_borrowed_capacity_as_its_gang_is_not(
    api: httpx.Client, server: ServerThread
) -> None:
    """The claim reads the pool's kind: a sensitive pool's work is never preempted, so a single job
    of one waits rather than take capacity another pool is guaranteed, as an equal gang does."""
    assert api.put("/pools/home", json={"guarantee": {"gpus": 1}}).status_code == 200
    assert api.put("/pools/secure", json={"kind": "sensitive"}).status_code == 200
    register(api, "w1", gpus=1, vram_mb=1000)
    register(api, "w2", gpus=1, vram_mb=1000)
    first = submit(api, resources={"gpus": 1}, preemption_class=2, checkpoint="auto", pool="secure")
    assert claim(api, "w1").json()["id"] == first["id"], "one GPU is left for home's guarantee"
    second = submit(api, resources={"gpus": 1}, preemption_class=2, checkpoint="auto", pool="secure/team")
    assert claim(api, "w2").status_code == 204, "class 2 with checkpoints, but its pool is sensitive"
    server.run_loop("admission")
    reasons = [reason["code"] for reason in api.get(f"/jobs/{second['id']}/why").json()["reasons"]]
    assert "borrowing_refused" in reasons
    gang = submit(api, resources={"gpus": 1}, gang_size=2, preemption_class=2, pool="secure")
    server.run_loop("admission")
    assert api.get(f"/jobs/{gang['tasks'][0]}").json()["status"] == "blocked"
    assert api.put("/pools/home", json={"guarantee": {"gpus": 0}}).status_code == 200
    assert claim(api, "w2").json()["id"] == second["id"], "no guarantee left to protect: it starts"


def test_the_checkpoint_duration_is_timed_from_the_hint_not_from_the_decision(
    api: httpx.Client, server: ServerThread, clock
) -> None:
    """Seed 003's ``checkpoint_duration_seconds``: time from hint to checkpoint completion. The
    victim's worker hears of the preemption 20 s after the decision (its next heartbeat); it saves
    in 7 s: 7 s are observed, not 27."""
    register(api, "w1", gpus=1, vram_mb=1000)
    low = low_job_running(api, clock, checkpoint="auto")
    submit(api, resources={"gpus": 1}, preemption_class=7)
    server.run_loop("admission")
    clock.advance(20)
    answer = beat(api, low)
    assert answer["action"] == "checkpoint" and 579 <= answer["deadline_s"] <= 580, "the phase's clock runs"
    clock.advance(3)
    assert beat(api, low)["action"] == "checkpoint", "a later answer is no new hint"
    clock.advance(4)
    upload = api.post(f"/jobs/{low['id']}/checkpoint", params=fenced(low, epoch=1), content=b"step 9")
    assert upload.status_code == 200, upload.text
    metrics = api.get("/metrics").text
    assert "corral_preemption_checkpoint_duration_seconds_count 1.0" in metrics
    assert "corral_preemption_checkpoint_duration_seconds_sum 7.0" in metrics


def test_why_tells_a_job_past_the_cycles_read_of_preemptors_that_none_is_planned_for_it(
    api: httpx.Client, server: ServerThread, clock
) -> None:
    """The second search cap over HTTP: 1,000 waiting jobs of its class are ahead of the last one,
    so the cycle's read of possible preemptors stops before it; its ``why`` says so. The first
    one, within the read, is not told."""
    register(api, "w1", gpus=1, vram_mb=1000)
    low_job_running(api, clock)  # class 2 runs: jobs of class 2 and above are read as preemptors
    body = {"command": "true", "resources": {"gpus": 1}, "preemption_class": 2}
    batch = api.post("/jobs/batch", json={"jobs": [body] * 1001})
    assert batch.status_code == 201, batch.text
    items = batch.json()["items"]
    first, last = items[0]["id"], items[-1]["id"]
    server.run_loop("admission")
    codes = [reason["code"] for reason in api.get(f"/jobs/{last}/why").json()["reasons"]]
    assert (codes[0], codes[-1]) == ("waiting_for_capacity", "search_limited")
    message = api.get(f"/jobs/{last}/why").json()["reasons"][-1]["message"]
    assert "reads at most 1,000 pending jobs per cycle" in message
    within = api.get(f"/jobs/{first}/why").json()["reasons"]
    assert "search_limited" not in [reason["code"] for reason in within]
