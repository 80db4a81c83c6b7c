"""Topology in the simulator (issue 25): rack and block columns in the cluster CSV, the topology
column in the workload CSV, and the gang spread the summary and report give, off and on."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from corral.sim import engine, readers
from corral.sim.policy import POLICIES
from corral.sim.readers import InputError
from corral.sim.summary import summarize
from corral.sim.workload import Cluster, Scenario, Workload, WorkloadJob


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_rack_and_block_columns_become_topology_labels(tmp_path) -> None:
    path = write(tmp_path, "c.csv", "worker_id,gpus,rack,block,count\nn,8,r1,b1,2\nm,8,,,1\n")
    cluster = readers.read_cluster(path)
    assert [worker.labels for worker in cluster.workers] == [
        {"topology.block": "b1", "topology.rack": "r1"},
        {"topology.block": "b1", "topology.rack": "r1"},
        {},
    ]


def test_the_topology_column_is_read_and_a_bad_one_says_where(tmp_path) -> None:
    header = "job_id,submit_time,duration,gpus,gang_size,topology\n"
    path = write(tmp_path, "w.csv", header + "g,0,60,8,2,required:topology.rack\nh,0,60,8,2,\n")
    first, second = readers.read_workload(path).jobs
    assert (first.topology, second.topology) == (("required", "topology.rack"), None)
    bad = write(tmp_path, "bad.csv", header + "g,0,60,8,2,needed:topology.rack\n")
    with pytest.raises(InputError, match=r"bad.csv:2: column 6 \(topology\)"):
        readers.read_workload(bad)


def scenario() -> Scenario:
    """Six workers in three racks of two where the worker ids alternate racks, a rack-required
    gang of two and a gang of four: the id-order placement splits both over racks."""
    racks = ["r1", "r2", "r3", "r1", "r2", "r3"]
    cluster = Cluster(
        tuple(
            replace(
                readers.uniform_cluster(6, 8).workers[index],
                labels={"topology.block": "b1", "topology.rack": rack},
            )
            for index, rack in enumerate(racks)
        ),
        name="3 racks of 2",
    )
    jobs = (
        WorkloadJob("pair", 0.0, 600.0, 8, gang_size=2, topology=("required", "topology.rack")),
        WorkloadJob("four", 1.0, 600.0, 8, gang_size=4),
    )
    return Scenario(Workload(jobs, name="two gangs"), cluster)


def run(levels: str) -> dict:
    base = scenario()
    chosen = replace(base, settings=replace(base.settings, topology_levels=levels))
    return summarize(chosen, engine.Engine(chosen, POLICIES["corral"]).run(), "corral")["gang_spread"]


def test_the_gang_spread_with_the_topology_off_and_on() -> None:
    off = run("")
    assert (off["required_rack_gangs"], off["required_rack_split"]) == (1, 1)
    on = run("topology.block,topology.rack")
    assert (on["required_rack_gangs"], on["required_rack_split"]) == (1, 0)
    by_hosts = {hosts: row["mean_racks"] for hosts, row in on["by_hosts"].items()}
    assert by_hosts == {"2": 1.0, "4": 2.0}
    assert on["multi_host"]["ratio"] == 1.0 and off["multi_host"]["ratio"] > 1.0


def test_the_levels_are_set_like_the_servers_and_empty_turns_the_topology_off() -> None:
    from corral.cli.sim import settings_from

    assert settings_from(["CORRAL_TOPOLOGY_LEVELS=topology.rack"]).topology_levels == "topology.rack"
    assert settings_from(["CORRAL_TOPOLOGY_LEVELS="]).topology_levels == ""
