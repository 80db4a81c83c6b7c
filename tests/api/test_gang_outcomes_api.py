"""How a gang ends when its ranks race or trip: each case a defect found in review, over real HTTP
on both stores."""

from __future__ import annotations

from tests.helpers import admitted_and_running, claim, fenced, gang_workers, submit_gang


def test_a_rank_done_while_its_peer_is_still_reserved_leaves_the_peer_claimable(api, server):
    """Rank 0 claims and finishes before rank 1 has claimed its reservation: a normal race. The
    report must succeed (it answered 500 in complete_drain, and so did every reaper pass), rank 1
    must stay claimable, and the gang must end done."""
    gang_workers(api, 2)
    gang = submit_gang(api, 2)
    server.run_loop("admission")
    rank0 = claim(api, "w0")
    done = api.post(f"/jobs/{rank0['id']}/done", params=fenced(rank0))
    assert (done.status_code, done.json()["status"]) == (200, "done")
    server.reap()
    tasks = api.get(f"/gangs/{gang['gang_id']}").json()["tasks"]
    assert [task["status"] for task in tasks] == ["done", "reserved"]
    rank1 = claim(api, "w1")
    assert rank1["id"] == gang["tasks"][1]
    api.post(f"/jobs/{rank1['id']}/done", params=fenced(rank1)).raise_for_status()
    assert api.get(f"/gangs/{gang['gang_id']}").json()["status"] == "done"


def test_a_rank_trip_is_counted_requeued_only_when_its_drain_requeues_the_gang(api, server, settings):
    settings.watchdog_max_retries = 3
    gang, (rank0, rank1) = admitted_and_running(api, server)
    api.post(f"/jobs/{rank0['id']}/watchdog", params=fenced(rank0), json={"kind": "stall"}).raise_for_status()
    assert 'corral_watchdog_trips_total{kind="stall"' not in api.get("/metrics").text, (
        "undecided while the drain runs"
    )
    api.post(f"/jobs/{rank1['id']}/preempted", params=fenced(rank1, epoch=1)).raise_for_status()
    metrics = api.get("/metrics").text
    assert 'corral_watchdog_trips_total{kind="stall",outcome="requeued"} 1.0' in metrics
    tasks = api.get(f"/gangs/{gang['gang_id']}").json()["tasks"]
    assert [task["status"] for task in tasks] == ["blocked", "blocked"]


def test_a_rank_trip_whose_drain_fails_the_gang_is_counted_failed(api, server):
    """The drained peer finished instead of stopping: the gang cannot run whole again, so the trip
    re-queued nothing (it was counted ``requeued`` at trip time before)."""
    gang, (rank0, rank1) = admitted_and_running(api, server)
    api.post(
        f"/jobs/{rank0['id']}/watchdog", params=fenced(rank0), json={"kind": "budget"}
    ).raise_for_status()
    api.post(f"/jobs/{rank1['id']}/done", params=fenced(rank1)).raise_for_status()
    metrics = api.get("/metrics").text
    assert 'corral_watchdog_trips_total{kind="budget",outcome="failed"} 1.0' in metrics
    assert 'outcome="requeued"' not in metrics
    assert api.get(f"/gangs/{gang['gang_id']}").json()["status"] == "failed"


def test_a_tripped_gang_goes_back_to_the_front_of_its_queue(api, server, clock):
    """A single job a watchdog re-queues goes to the front of its queue; a gang whose drain began
    with a trip does too: placed before an older gang of the same size, class and priority that
    was drained by a plain failure."""
    gang_workers(api, 4)
    older = submit_gang(api, 2)
    clock.advance(1)
    newer = submit_gang(api, 2)
    server.run_loop("admission")
    ranks = {worker: claim(api, worker) for worker in ("w0", "w1", "w2", "w3")}
    by_gang = {task["gang_id"]: [] for task in ranks.values()}
    for task in ranks.values():
        by_gang[task["gang_id"]].append(task)
    old0, old1 = by_gang[older["gang_id"]]
    new0, new1 = by_gang[newer["gang_id"]]
    api.post(f"/jobs/{old0['id']}/fail", params=fenced(old0), json={"exit_code": 1}).raise_for_status()
    api.post(f"/jobs/{old1['id']}/preempted", params=fenced(old1, epoch=1)).raise_for_status()
    api.post(f"/jobs/{new0['id']}/watchdog", params=fenced(new0), json={"kind": "stall"}).raise_for_status()
    api.post(f"/jobs/{new1['id']}/preempted", params=fenced(new1, epoch=1)).raise_for_status()
    for gang in (older, newer):
        assert {task["status"] for task in api.get(f"/gangs/{gang['gang_id']}").json()["tasks"]} == {
            "blocked"
        }
    # room for one gang of two only
    for worker in ("w2", "w3"):
        api.post(f"/workers/{worker}/drain").raise_for_status()
    server.run_loop("admission")
    assert api.get(f"/gangs/{newer['gang_id']}").json()["status"] == "reserved"
    assert api.get(f"/gangs/{older['gang_id']}").json()["status"] == "blocked"
