"""The summary's gang figures on hand-built records: the time a gang's pool was owed capacity while
it waited, starved against over the bound, and the peak gang load."""

from __future__ import annotations

import pytest

from corral.domain.pools import PoolSettings
from corral.sim.engine import Record
from corral.sim.readers import uniform_cluster
from corral.sim.summary import peak_gang_load, summarize, time_below_fair_share
from corral.sim.workload import Scenario, SimSettings, Workload, WorkloadJob

HOUR = 3600.0


def gang(job_id: str, submit: float, pool: str, size: int = 2, duration: float = 100.0) -> WorkloadJob:
    return WorkloadJob(job_id, submit, duration, 4, gang_size=size, pool=pool)


def scenario(*jobs: WorkloadJob, bound: float = 10.0) -> Scenario:
    # two pools of equal weight on 4 x 4 GPUs: a fair share of 8 GPUs each, 6.4 under the tolerance
    return Scenario(
        Workload(jobs),
        uniform_cluster(4, 4),
        {"a": PoolSettings(weight=1.0), "b": PoolSettings(weight=1.0)},
        SimSettings(starvation_bound_s=bound),
    )


def test_only_the_wait_while_the_pool_held_less_than_its_share_is_owed() -> None:
    waiting = gang("g", 0.0, "a")
    case = scenario(waiting, WorkloadJob("mine", 0.0, 50, 8, pool="a"))
    record = Record()
    # pool a holds 8 GPUs (its share) from 0 to 30, nothing from 30 to 45, then the gang starts
    record.allocation = [(0.0, "a", 8), (30.0, "a", -8), (45.0, "a", 8)]
    record.starts["g"] = 45.0
    owed = time_below_fair_share([waiting], record, {"a": 8.0, "b": 8.0}, case, end=100.0)
    assert owed == {"g": pytest.approx(15.0)}


def test_a_gang_that_never_started_is_owed_until_the_end() -> None:
    waiting = gang("g", 10.0, "b")
    case = scenario(waiting)
    owed = time_below_fair_share([waiting], Record(), {"a": 8.0, "b": 8.0}, case, end=70.0)
    assert owed == {"g": pytest.approx(60.0)}


def test_a_gang_waiting_behind_its_own_pools_work_is_over_the_bound_but_not_starved() -> None:
    behind_own = gang("own", 0.0, "a")
    owed_one = gang("owed", 0.0, "b")
    case = scenario(behind_own, owed_one, WorkloadJob("mine", 0.0, 50, 8, pool="a"), bound=10.0)
    record = Record()
    record.allocation = [(0.0, "a", 8), (50.0, "a", -8), (50.0, "a", 8), (50.0, "b", 8)]
    record.starts.update({"mine": 0.0, "own": 50.0, "owed": 50.0})
    record.ends.update({"mine": 50.0, "own": 150.0, "owed": 150.0})
    summary = summarize(case, record, "corral")
    assert summary["gangs_over_bound"] == 2
    assert summary["starved_gangs"] == 1
    listed = {entry["job_id"]: entry for entry in summary["gangs"]}
    assert listed["owed"]["starved"] and listed["owed"]["below_fair_share_s"] == pytest.approx(50.0)
    assert not listed["own"]["starved"] and listed["own"]["below_fair_share_s"] == 0.0
    assert summary["pools"]["b"]["starved_gangs"] == 1 and summary["pools"]["a"]["gangs_over_bound"] == 1


def test_a_gang_larger_than_its_pools_share_is_starved_but_not_within_share() -> None:
    # fair shares of 8 GPUs: a 2 x 4 gang fits its pool's share, a 4 x 4 gang (16 GPUs) never does
    fits = gang("fits", 0.0, "a", size=2)
    too_big = gang("too-big", 0.0, "b", size=4)
    case = scenario(fits, too_big, bound=10.0)
    record = Record()
    record.starts.update({"fits": 50.0, "too-big": 60.0})
    record.ends.update({"fits": 150.0, "too-big": 160.0})
    summary = summarize(case, record, "corral")
    assert summary["starved_gangs"] == 2
    assert summary["starved_gangs_within_share"] == 1
    listed = {entry["job_id"]: entry for entry in summary["gangs"]}
    assert listed["fits"]["starved_within_share"] and listed["fits"]["owed_start_s"] == pytest.approx(50.0)
    assert listed["too-big"]["starved"] and not listed["too-big"]["starved_within_share"]
    assert listed["too-big"]["owed_start_s"] == 0.0
    assert summary["pools"]["a"]["starved_gangs_within_share"] == 1
    assert summary["pools"]["b"]["starved_gangs_within_share"] == 0


def test_within_share_counts_only_while_the_pool_has_room_in_its_share_for_the_gang() -> None:
    waiting = gang("g", 0.0, "a", size=1)  # 4 GPUs, a share of 8 (6.4 under the tolerance)
    case = scenario(waiting)
    record = Record()
    # pool a holds 6 GPUs from 0 to 20 (below the tolerance, but 6 + 4 > 8), then 2 until 45
    record.allocation = [(0.0, "a", 6), (20.0, "a", -4), (45.0, "a", -2)]
    record.starts["g"] = 45.0
    shares = {"a": 8.0, "b": 8.0}
    assert time_below_fair_share([waiting], record, shares, case, end=100.0) == {"g": pytest.approx(45.0)}
    within = time_below_fair_share([waiting], record, shares, case, end=100.0, within_share=True)
    assert within == {"g": pytest.approx(25.0)}


def test_peak_gang_load_is_the_busiest_window_over_the_clusters_capacity() -> None:
    gangs = [
        gang("early", 0.0, "a", size=2, duration=HOUR),  # 8 GPU-hours
        gang("late-1", 10 * HOUR, "a", size=4, duration=HOUR),  # 16 GPU-hours
        gang("late-2", 11 * HOUR, "b", size=4, duration=HOUR),  # 16 GPU-hours
    ]
    # 16 GPUs over 2 h: 32 GPU-hours; the two late gangs fall in one window
    assert peak_gang_load(gangs, 16, 2 * HOUR) == pytest.approx(1.0)
    assert peak_gang_load(gangs, 16, HOUR / 2) == pytest.approx(16 / 8)
    assert peak_gang_load([], 16, HOUR) == 0.0


def test_estimated_start_accuracy_reads_each_first_estimate_against_the_start() -> None:
    """The first estimate counts (what a user saw first); a job that lost its estimate is counted
    as lost; early and late beyond one tick (5 s)."""
    jobs = (
        WorkloadJob("on_time", 0.0, 10, 1),
        WorkloadJob("late", 0.0, 10, 1),
        WorkloadJob("early", 0.0, 10, 1),
        WorkloadJob("never", 0.0, 10, 1),
        gang("g", 0.0, "a"),
    )
    case = scenario(*jobs)
    record = Record()
    record.estimates = {
        "on_time": [(5.0, 100.0)],
        "late": [(5.0, 100.0), (50.0, None), (60.0, 300.0)],  # lost it, then a later one
        "early": [(5.0, 200.0)],
        "never": [(5.0, 100.0)],  # never started: not counted
        "g": [(5.0, 400.0), (10.0, 380.0)],
    }
    record.starts.update({"on_time": 100.0, "late": 300.0, "early": 100.0, "g": 400.0})
    figures = summarize(case, record, "corral")["estimated_start"]
    assert figures["jobs"] == 4 and figures["gangs"] == 1
    # errors: 0, 200, 100, 0 seconds; of the waits (100, 300, 100, 400): 0, 2/3, 1, 0
    assert figures["error_s"]["p50"] == pytest.approx(50.0)
    assert figures["error_of_wait"]["p90"] == pytest.approx(0.9)
    assert (figures["early"], figures["late"], figures["lost"]) == (1, 1, 1)
    assert figures["gang_error_s"]["p50"] == 0.0 and figures["gang_error_of_wait"]["p50"] == 0.0


def test_a_gang_over_the_bound_lists_its_reservation_history() -> None:
    waiting = gang("g", 0.0, "a")
    case = scenario(waiting, bound=10.0)
    record = Record()
    record.estimates = {"g": [(5.0, 50.0), (20.0, None), (25.0, 60.0)]}
    record.starts["g"] = 60.0
    record.ends["g"] = 160.0
    (listed,) = summarize(case, record, "corral")["gangs"]
    assert listed["reservations"] == [[5.0, 50.0], [20.0, None], [25.0, 60.0]]
    assert listed["reservation_changes"] == 3


def test_the_report_writes_a_gangs_reservation_history_in_hours() -> None:
    from corral.sim.report import reservation_history

    listed = {"reservations": [[1800.0, 7200.0], [3600.0, None]], "reservation_changes": 5}
    assert reservation_history(listed) == "... 0.5: 2.0; 1.0: none"
    assert reservation_history({"reservations": []}) == "never reserved"
