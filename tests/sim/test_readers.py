"""The simulator's input files: what they mean, and bad input named by file, line and column."""

from __future__ import annotations

from pathlib import Path

import pytest

from corral.domain.resources import Resources
from corral.sim import readers
from corral.sim.readers import InputError

TRACES = Path("/work/shared/traces")


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_a_workload_with_the_optional_columns_left_out_takes_the_submit_defaults(tmp_path) -> None:
    path = write(tmp_path, "w.csv", "job_id,submit_time,duration,gpus\na,0,10,1\nb,2.5,20,0\n")
    workload = readers.read_workload(path)
    first = workload.jobs[0]
    assert (first.gang_size, first.pool, first.preemption_class, first.checkpoint) == (
        1,
        "default",
        5,
        "none",
    )
    assert workload.jobs[1].submit_time == 2.5 and workload.name == "w"


def test_every_column_is_read(tmp_path) -> None:
    header = "job_id,submit_time,duration,gpus,gang_size,pool,user,preemption_class,checkpoint,"
    header += "checkpoint_every_s,cpus,memory_mb,vram_mb,walltime\n"
    path = write(tmp_path, "w.csv", header + "g,1,60,8,4,team/a,ann,7,auto,600,16,1024,80000,3600\n")
    (job,) = readers.read_workload(path).jobs
    assert job.walltime == 3600.0
    assert (job.gang_size, job.pool, job.user, job.preemption_class) == (4, "team/a", "ann", 7)
    assert (job.checkpoint, job.checkpoint_every_s, job.cpus, job.memory_mb, job.vram_mb) == (
        "auto", 600.0, 16, 1024, 80000,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("text", "where", "message"),
    [
        ("job_id,submit_time,duration\na,0,1\n", "w.csv:1", "missing required column 'gpus'"),
        (
            "job_id,submit_time,duration,gpus,colour\na,0,1,1,red\n",
            "w.csv:1: column 5 (colour)",
            "unknown column",
        ),
        ("job_id,submit_time,duration,gpus\na,0,1,1\nb,0,x,1\n", "w.csv:3: column 3 (duration)", "seconds"),
        ("job_id,submit_time,duration,gpus\na,0,1,1.5\n", "w.csv:2: column 4 (gpus)", "whole number"),
        ("job_id,submit_time,duration,gpus\na,-1,1,1\n", "w.csv:2: column 2 (submit_time)", ">= 0"),
        (
            "job_id,submit_time,duration,gpus\na,0,1,1\na,0,1,1\n",
            "w.csv:3: column 1 (job_id)",
            "repeats line 2",
        ),
        ("job_id,submit_time,duration,gpus,pool\na,0,1,1,../x\n", "w.csv:2: column 5 (pool)", "pool must be"),
        ("job_id,submit_time,duration,gpus,checkpoint\na,0,1,1,often\n", "w.csv:2: column 5", "one of none"),
        ("job_id,submit_time,duration,gpus,preemption_class\na,0,1,1,11\n", "w.csv:2: column 5", "0..10"),
        ("job_id,submit_time,duration,gpus\na,0,1\n", "w.csv:2", "3 fields, the header has 4"),
    ],
)
def test_bad_workloads_are_named_by_file_line_and_column(tmp_path, text, where, message) -> None:
    path = write(tmp_path, "w.csv", text)
    with pytest.raises(InputError) as raised:
        readers.read_workload(path)
    assert str(raised.value).startswith(str(tmp_path / where)), str(raised.value)
    assert message in str(raised.value)


def test_a_cluster_row_with_a_count_is_repeated(tmp_path) -> None:
    path = write(
        tmp_path,
        "c.csv",
        "worker_id,gpus,cpus,memory_mb,vram_mb,gpu_model,count\nnode,8,64,512000,80000,H100,12\n",
    )
    cluster = readers.read_cluster(path)
    assert [worker.id for worker in cluster.workers][:2] == ["node-00", "node-01"]
    assert len(cluster.workers) == 12 and cluster.gpus == 96
    assert cluster.workers[0].resources == Resources(8, 80000, 512000, 64)
    assert cluster.workers[0].gpu_model == "H100"


def test_bad_clusters_say_where(tmp_path) -> None:
    path = write(tmp_path, "c.csv", "worker_id,gpus\nw1,8\nw1,4\n")
    with pytest.raises(InputError, match=r"c.csv:3: column 1 \(worker_id\): worker 'w1' repeats line 2"):
        readers.read_cluster(path)
    with pytest.raises(InputError, match="cannot open"):
        readers.read_cluster(tmp_path / "missing.csv")


def test_pools_are_the_put_bodies(tmp_path) -> None:
    path = write(
        tmp_path,
        "p.json",
        '{"pools": {"team": {"weight": 2, "guarantee": {"gpus": 16}, "limits": {"gpus": 32}},\n'
        ' "team/infer": {"kind": "service"}}}',
    )
    pools = readers.read_pools(path)
    assert pools["team"].weight == 2.0 and pools["team"].guarantee == Resources(gpus=16)
    assert pools["team/infer"].kind == "service"


def test_pools_carry_their_time_limits(tmp_path) -> None:
    path = write(tmp_path, "p.json", '{"pools": {"team": {"default_walltime_s": 60, "max_walltime_s": 600}}}')
    team = readers.read_pools(path)["team"]
    assert (team.default_walltime_s, team.max_walltime_s) == (60.0, 600.0)


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ('{"pools": {"a": {"weight": 1}\n', r"p.json:2: column 1: "),
        ('{"pools": {\n "a": {"weight": 0}}}', r"p.json:2: pool 'a': weight must be a number > 0"),
        ('{"pools": {\n "a": {"colour": 1}}}', r"p.json:2: pool 'a': unknown field 'colour'"),
        ('{"pools": {\n "a": {"guarantee": {"gpus": 8}, "limits": {"gpus": 4}}}}', "below the guarantee"),
        ('{"pool": {}}', r"p.json:1: column 1: expected \{\"pools\""),
        ('{"pools": {"a": {"default_walltime_s": 60, "max_walltime_s": 30}}}', "above max_walltime_s"),
    ],
)
def test_bad_pools_say_where(tmp_path, text, match) -> None:
    path = write(tmp_path, "p.json", text)
    with pytest.raises(InputError, match=match):
        readers.read_pools(path)


@pytest.mark.skipif(not TRACES.exists(), reason="the shared traces are not on this machine")
def test_the_alibaba_trace_is_read_as_it_is_with_its_nodes_as_the_cluster() -> None:
    jobs = TRACES / "alibaba-gpu-v2023" / "jobs.csv"
    workload = readers.read_workload(jobs)
    assert len(workload.jobs) == 7255 and len(workload.unscheduled) == 897
    nodes = readers.alibaba_nodes_beside(jobs)
    assert nodes is not None
    cluster = readers.read_cluster(nodes)
    assert len(cluster.workers) == 1213 and cluster.gpus == 6212
    first = workload.jobs[0]
    assert (first.job_id, first.gpus, first.preemption_class, first.production_start) == (
        "openb-pod-0000", 1, 7, 0.0,
    )  # fmt: skip


@pytest.mark.skipif(not TRACES.exists(), reason="the shared traces are not on this machine")
def test_pools_are_assigned_from_the_venus_quotas_in_proportion_with_a_seed() -> None:
    quotas = readers.venus_quotas(TRACES / "helios-venus" / "cluster_gpu_number.csv")
    assert len(quotas) > 10 and all(quota > 0 for quota in quotas.values())
    workload = readers.Workload(
        tuple(readers.WorkloadJob(f"j{index}", index, 10, 1) for index in range(4000))
    )
    cluster = readers.uniform_cluster(10, 8)
    assigned, pools = readers.assign_pools(workload, cluster, quotas, seed=7)
    again, _ = readers.assign_pools(workload, cluster, quotas, seed=7)
    assert [job.pool for job in assigned.jobs] == [job.pool for job in again.jobs]
    largest = max(quotas, key=lambda name: quotas[name])
    share = sum(job.pool == f"venus/{largest}" for job in assigned.jobs) / 4000
    assert abs(share - quotas[largest] / sum(quotas.values())) < 0.03
    assert sum(settings.guarantee.gpus for settings in pools.values() if settings.guarantee) <= 80


@pytest.mark.parametrize(
    ("duration", "factor", "expected"),
    [
        (0, 2, 900),  # at least one step of 15 minutes
        (100, 2, 900),
        (450, 2, 900),  # exactly one step
        (451, 2, 1800),  # just over: the next step
        (3600, 1.5, 5400),
        (7000, 0.5, 3600),  # a factor below 1: the job outlasts its limit
    ],
)
def test_a_derived_walltime_is_the_runtime_times_the_factor_rounded_up_to_15_minutes(
    duration, factor, expected
) -> None:
    assert readers.derived_walltime(duration, factor) == expected


def test_with_walltimes_keeps_a_declared_walltime_and_refuses_a_factor_not_above_zero(tmp_path) -> None:
    path = write(tmp_path, "w.csv", "job_id,submit_time,duration,gpus,walltime\na,0,1000,1,\nb,0,1000,1,60\n")
    workload = readers.with_walltimes(readers.read_workload(path), 2)
    assert [job.walltime for job in workload.jobs] == [2700, 60]
    for factor in (0, -1, float("nan")):
        with pytest.raises(ValueError, match="walltime factor"):
            readers.with_walltimes(workload, factor)


@pytest.mark.skipif(not TRACES.exists(), reason="the shared traces are not on this machine")
def test_the_alibaba_trace_gets_walltimes_from_its_runtimes() -> None:
    trace = readers.read_workload(TRACES / "alibaba-gpu-v2023" / "jobs.csv")
    assert all(job.walltime is None for job in trace.jobs)
    limited = readers.with_walltimes(trace, 2)
    assert all(job.walltime is not None and job.walltime >= 2 * job.duration for job in limited.jobs)
    assert all(job.walltime is not None and job.walltime % 900 == 0 for job in limited.jobs)
