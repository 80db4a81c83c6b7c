"""The engine on tiny workloads: golden times, the work a preemption loses, stop conditions."""

from __future__ import annotations

from corral.domain.pools import PoolSettings
from corral.domain.resources import Resources
from corral.sim import engine
from corral.sim.policy import CORRAL, FIFO
from corral.sim.readers import uniform_cluster
from corral.sim.summary import summarize
from corral.sim.workload import Scenario, SimSettings, Workload, WorkloadJob

SETTINGS = SimSettings(heartbeat_s=5.0, checkpoint_save_s=10.0, stop_s=1.0)


def scenario(*jobs: WorkloadJob, workers: int = 1, gpus: int = 2) -> Scenario:
    return Scenario(Workload(jobs), uniform_cluster(workers, gpus), settings=SETTINGS)


def test_a_job_no_worker_can_hold_ends_the_run_unfinished() -> None:
    case = scenario(WorkloadJob("small", 0, 10, 1), WorkloadJob("huge", 0, 10, 4))
    record = engine.run(case, CORRAL)
    summary = summarize(case, record, "corral")
    assert (summary["finished"], summary["unfinished"]) == (1, 1)
    assert record.ends == {"small": 10.0}


def test_a_gang_waits_for_the_tick_then_works_from_its_last_rank() -> None:
    case = scenario(WorkloadJob("g", 1, 100, 2, gang_size=2), workers=2)
    record = engine.run(case, CORRAL, record_decisions=True)
    assert record.starts["g"] == 5.0, "reserved by the admission cycle at its tick, claimed at once"
    assert record.ends["g"] == 105.0


def test_a_victim_without_a_checkpoint_starts_over_and_one_with_a_periodic_save_resumes_from_it() -> None:
    for every, expected_end, lost in ((None, 100 + 11 + 60, 22.0), (5.0, 100 + 11 + 60 - 10, 2.0)):
        case = scenario(
            WorkloadJob("low", 0, 60, 2, preemption_class=2, checkpoint_every_s=every),
            WorkloadJob("high", 2, 100, 2, preemption_class=8),
        )
        record = engine.run(case, CORRAL)
        # the cycle at 5 preempts; the victim hears it at 10, exits and is acked at 11; high runs
        # 11..111; low runs again from 111 for all its work, or less the 10 s it saved at 5 and 10
        assert record.starts["high"] == 11.0
        assert record.ends["low"] == expected_end
        ((_, victim, _, gpus, lost_gpu_s),) = record.preemptions
        assert (victim, gpus, lost_gpu_s) == ("low", 2, lost)


def test_a_victim_that_checkpoints_keeps_its_work_up_to_the_signal() -> None:
    case = scenario(
        WorkloadJob("low", 0, 60, 2, preemption_class=2, checkpoint="auto"),
        WorkloadJob("high", 2, 100, 2, preemption_class=8),
    )
    record = engine.run(case, CORRAL)
    # preempted at 5, SIGUSR1 at 10 (saves 10 s of work), uploaded at 20, told to stop at 25, acked 26
    assert record.starts["high"] == 26.0
    assert record.ends["low"] == 126.0 + 50.0
    assert record.preemptions[0][4] == 2 * 16.0, "it worked on from the save until it stopped"


def test_fifo_ignores_class_and_never_preempts() -> None:
    jobs = (
        WorkloadJob("first", 0, 50, 2, preemption_class=2),
        WorkloadJob("low", 1, 10, 2, preemption_class=1),
        WorkloadJob("high", 2, 10, 2, preemption_class=9),
    )
    fifo = engine.run(scenario(*jobs), FIFO)
    assert (fifo.starts["low"], fifo.starts["high"]) == (50.0, 60.0) and not fifo.preemptions
    corral = engine.run(scenario(*jobs), CORRAL)
    assert corral.preemptions and corral.starts["high"] < corral.starts["low"]


def test_a_run_is_deterministic() -> None:
    jobs = tuple(
        WorkloadJob(f"j{index}", index * 3, 20 + index % 7, 1 + index % 2, preemption_class=index % 9)
        for index in range(40)
    )
    first = engine.run(scenario(*jobs, workers=3), CORRAL, record_decisions=True)
    second = engine.run(scenario(*jobs, workers=3), CORRAL, record_decisions=True)
    assert first.decisions == second.decisions and len(first.ends) == 40


def test_every_policy_keeps_unreclaimable_gangs_off_borrowed_capacity() -> None:
    """Admission's borrowing rule reads the pools whether or not fair share is planned: under FIFO
    too, a class-10 gang that would take the GPUs another pool is guaranteed never starts (it
    could never be taken back), and the guaranteed pool's work runs at once."""
    pools = {"home": PoolSettings(guarantee=Resources(gpus=4))}
    jobs = (
        WorkloadJob("g", 0, 50, 2, gang_size=2, pool="guest", preemption_class=10),
        WorkloadJob("h", 20, 30, 2, gang_size=2, pool="home"),
    )
    case = Scenario(Workload(jobs), uniform_cluster(2, 2), pools, SETTINGS)
    for policy in (CORRAL, FIFO):
        record = engine.run(case, policy)
        assert "g" not in record.starts, policy.name
        assert record.starts["h"] == 20.0, policy.name


def test_a_job_whose_work_outlasts_its_walltime_is_ended_at_it_and_fails() -> None:
    """As the worker does: stopped at its claim plus the limit, reported ``stop_s`` later, not
    retried; a job whose work ends within its limit is done."""
    case = scenario(WorkloadJob("long", 0, 100, 1, walltime=30), WorkloadJob("short", 0, 20, 1, walltime=30))
    record = engine.run(case, CORRAL, record_decisions=True)
    assert record.timed_out == ["long"]
    assert record.ends == {"long": 31.0, "short": 20.0}
    failed = [decision for decision in record.decisions if decision[2] == "long" and decision[1] == "failed"]
    assert [decision[0] for decision in failed] == [31.0]
    assert [decision[1] for decision in record.decisions if decision[2] == "long"].count("running") == 1


def test_a_pools_default_walltime_applies_and_a_walltime_above_its_maximum_is_refused() -> None:
    pools = {"short": PoolSettings(default_walltime_s=10.0, max_walltime_s=50.0)}
    jobs = (WorkloadJob("d", 0, 100, 1, pool="short"), WorkloadJob("x", 0, 10, 1, pool="short", walltime=60))
    record = engine.run(Scenario(Workload(jobs), uniform_cluster(1, 2), pools, SETTINGS), CORRAL)
    assert record.refused == ["x"]
    assert record.timed_out == ["d"] and record.ends == {"d": 11.0}


def test_a_blocked_gang_is_estimated_at_the_running_jobs_limit_and_starts_there() -> None:
    """Two workers of 2 GPUs, a 2-GPU job with a 100 s limit on one: the 2 x 2 gang submitted
    beside it gets an estimated start at that limit (the history the report shows), keeps it, and
    starts at the first tick after the job ends; the summary counts one estimate, right to the tick."""
    case = scenario(
        WorkloadJob("running", 0, 100, 2, walltime=100),
        WorkloadJob("gang", 1, 50, 2, gang_size=2, walltime=60),
        workers=2,
    )
    record = engine.run(case, CORRAL)
    assert record.estimates["gang"] == [(5.0, 100.0)], "estimated once, at the first tick"
    assert record.starts["gang"] == 100.0, "the job ends at 100, the tick at 100 reserves the gang"
    estimated = summarize(case, record, "corral")["estimated_start"]
    assert estimated["jobs"] == estimated["gangs"] == 1
    assert estimated["error_s"]["p50"] == 0.0 and (estimated["early"], estimated["late"]) == (0, 0)


def test_a_gang_whose_room_depends_on_work_without_a_limit_gets_no_estimate() -> None:
    case = scenario(
        WorkloadJob("unlimited", 0, 100, 2),
        WorkloadJob("gang", 1, 50, 2, gang_size=2, walltime=60),
        workers=2,
    )
    record = engine.run(case, CORRAL)
    assert "gang" not in record.estimates
    assert summarize(case, record, "corral")["estimated_start"]["jobs"] == 0


def test_a_gangs_exemption_running_out_while_nothing_waits_does_not_wake_every_tick() -> None:
    """The gang starts at the first tick and runs 10,000 s with nothing behind it: its exemption's
    end (60 s in) may decide nothing, so the engine jumps to the gang's end instead of visiting
    each of the 2,000 ticks between."""
    case = Scenario(
        Workload((WorkloadJob("g", 1, 10_000, 1, gang_size=2),)),
        uniform_cluster(1, 2),
        settings=SimSettings(heartbeat_s=5.0, checkpoint_save_s=10.0, stop_s=1.0, gang_preempt_exempt_s=60.0),
    )
    record = engine.run(case, CORRAL)
    assert record.ends["g"] == 10_005.0
    assert record.cycles_skipped < 10, record.cycles_skipped
