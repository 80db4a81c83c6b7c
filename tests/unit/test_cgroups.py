"""The cgroup port against a cgroupfs tree laid out in a directory: the v2 backend's limit files,
its OOM count and ``cgroup.kill``, kept slots rewritten, and the host's hierarchies found from
``/proc/self/cgroup`` and ``mountinfo``."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from corral.worker import cgroups
from corral.worker.cgroup_backends import V1Controller, V2Hierarchy
from corral.worker.cgroup_limits import Limits, attempt_limits


def _v2_tree(root: Path) -> Path:
    """A v2 cgroup as the kernel shows one: control files, controllers available."""
    own = root / "worker.service"
    own.mkdir(parents=True)
    (own / "cgroup.controllers").write_text("cpuset cpu io memory pids\n")
    (own / "cgroup.subtree_control").write_text("")
    return own


def _kernel_files(directory: Path) -> None:
    directory.mkdir(exist_ok=True)
    for name in (
        "cgroup.procs",
        "cgroup.kill",
        "cgroup.subtree_control",
        "memory.max",
        "cpu.max",
        "pids.max",
    ):
        (directory / name).touch()
    (directory / "memory.events").write_text("low 0\nhigh 0\nmax 0\noom 0\noom_kill 0\n")


def test_the_v2_backend_writes_the_limits_and_reads_the_kernels_oom_count(tmp_path: Path):
    own = _v2_tree(tmp_path)
    _kernel_files(own / "corral-w1")
    hierarchy = V2Hierarchy(own / "corral-w1", frozenset({"memory", "cpu", "pids", "io"}))
    containment = cgroups.Containment([hierarchy])
    assert containment.start() == []
    assert (own / "cgroup.subtree_control").read_text() == "+cpu +memory +pids"
    assert containment.enforcement == {
        "memory": "cgroup_v2", "cpu": "cgroup_v2", "pids": "cgroup_v2", "devices": "none",
        "kill_tree": "cgroup_v2_kill",
    }  # fmt: skip
    slot = own / "corral-w1" / "slot-1"
    _kernel_files(slot)
    group = containment.open(Limits(memory_bytes=512 * 1024 * 1024, cpus=2, pids_max=100))
    assert (slot / "memory.max").read_text() == str(512 * 1024 * 1024)
    assert (slot / "cpu.max").read_text() == "200000 100000"
    assert (slot / "pids.max").read_text() == "100"
    group.attach(4242)
    assert (slot / "cgroup.procs").read_text() == "4242"
    assert not group.oom_killed()
    (slot / "memory.events").write_text("oom 1\noom_kill 1\n")
    assert group.oom_killed()
    (slot / "cgroup.procs").write_text("")
    containment.close(group)
    # Kept for the next attempt: its limits rewritten, its OOM count read from where it is now.
    again = containment.open(Limits(cpus=0))
    assert again is group
    assert (slot / "memory.max").read_text() == "max" and (slot / "cpu.max").read_text() == "max 100000"
    assert not again.oom_killed()
    again.kill()
    assert (slot / "cgroup.kill").read_text() == "1"


def test_a_v2_hierarchy_without_controllers_still_kills_the_tree(tmp_path: Path):
    own = tmp_path / "unified"
    own.mkdir()
    _kernel_files(own / "corral-w1")
    containment = cgroups.Containment([V2Hierarchy(own / "corral-w1", frozenset())])
    containment.start()
    assert containment.enforcement["kill_tree"] == "cgroup_v2_kill"
    assert containment.enforcement["memory"] == "none"


def test_the_v1_devices_list_denies_other_gpus_and_a_kept_slot_allows_them_again(tmp_path: Path):
    base = tmp_path / "devices" / "corral-w1"
    base.mkdir(parents=True)
    containment = cgroups.Containment([V1Controller("devices", base)])
    containment.start()
    slot = base / "slot-1"
    slot.mkdir()
    for name in ("devices.allow", "devices.deny", "cgroup.procs"):
        (slot / name).touch()
    devices = {0: (195, 0), 1: (195, 1), 2: (195, 2)}
    group = containment.open(attempt_limits(0, 0, [1], None, None, devices))
    assert (slot / "devices.deny").read_text() == "c 195:2 rwm"  # the last of 195:0 and 195:2
    containment.close(group)
    # Every GPU given: nothing to deny, and the attempt does not even join the devices cgroup.
    everything = containment.open(attempt_limits(0, 0, [0, 1, 2], None, None, devices))
    assert [hierarchy.name for hierarchy, _ in everything.joined] == []
    containment.close(everything)
    containment.open(attempt_limits(0, 0, [0], None, None, devices))
    assert (slot / "devices.allow").read_text() == "c 195:2 rwm"  # the last of 195:0 and 195:2 again


def test_limits_follow_the_claim():
    devices = {0: (195, 0), 1: (195, 1)}
    assert attempt_limits(100, 2, [0], None, 50, devices) == Limits(100 * 1024 * 1024, 2.0, 50, ((195, 1),))
    assert attempt_limits(0, 0, [], 256, None, {}).memory_bytes == 256 * 1024 * 1024
    assert attempt_limits(0, 0, [], None, None, {}).memory_bytes is None


def test_the_hierarchies_are_found_from_proc(tmp_path: Path):
    proc = tmp_path / "proc"
    proc.mkdir()
    (proc / "cgroup").write_text("4:memory:/sandbox\n1:cpu:/\n0::/\n")
    mounts = tmp_path / "sys"
    (proc / "mountinfo").write_text(
        f"35 31 0:32 / {mounts}/memory rw - cgroup cgroup rw,memory\n"
        f"32 31 0:29 / {mounts}/cpu rw - cgroup cgroup rw,cpu\n"
        f"41 31 0:38 / {mounts}/unified rw - cgroup2 cgroup2 rw\n"
    )
    for directory in (mounts / "memory" / "sandbox", mounts / "cpu", mounts / "unified"):
        directory.mkdir(parents=True)
    (mounts / "unified" / "cgroup.controllers").write_text("")
    containment, line = cgroups.detect("corral-w1", proc)
    assert containment is not None
    bases = {hierarchy.name: hierarchy.base for hierarchy in containment.hierarchies}
    assert bases == {
        "v1:memory": mounts / "memory" / "sandbox" / "corral-w1",
        "v1:cpu": mounts / "cpu" / "corral-w1",
        "v2": mounts / "unified" / "corral-w1",
    }
    assert "v1:memory" in line


def test_a_host_without_cgroups_has_no_containment(tmp_path: Path):
    proc = tmp_path / "proc"
    proc.mkdir()
    (proc / "cgroup").write_text("0::/\n")
    (proc / "mountinfo").write_text("")
    containment, line = cgroups.detect("corral-w1", proc)
    assert containment is None and "without limits" in line


def test_a_job_the_host_will_not_move_into_its_cgroup_runs_without(tmp_path: Path):
    from corral.config import WorkerSettings
    from corral.testing.fake_client import FakeClient, claim_answer
    from corral.worker.job_run import JobRun

    own = tmp_path / "unified"
    own.mkdir()
    _kernel_files(own / "corral-w1")
    containment = cgroups.Containment([V2Hierarchy(own / "corral-w1", frozenset())])
    containment.start()
    slot = own / "corral-w1" / "slot-1"
    _kernel_files(slot)
    (slot / "cgroup.procs").unlink()
    (slot / "cgroup.procs").mkdir()  # a write to it fails, as a refused migration does
    client = FakeClient()
    run = JobRun(
        claim_answer(job_id="j-1", attempt=1, command="true"),
        client,
        WorkerSettings(heartbeat_s=0.05),
        "w1",
        lambda run: None,
        containment=containment,
    )
    run.start()
    assert run.finished.wait(15)
    assert client.names()[-1] == "done"


def _open_under(directory: Path) -> int:
    """How many of this process's descriptors are open on a file under ``directory``."""
    count = 0
    for name in os.listdir("/proc/self/fd"):
        try:
            count += os.readlink(f"/proc/self/fd/{name}").startswith(str(directory))
        except OSError:
            continue
    return count


def test_a_kept_slot_that_cannot_take_new_limits_closes_its_descriptors(tmp_path: Path):
    """A kept slot keeps its ``cgroup.procs`` descriptors for the next attempt; when the next
    attempt's limits cannot be written the slot is dropped, and must give them back (closed, and
    returned to the shared budget), not leak them."""
    own = _v2_tree(tmp_path)
    _kernel_files(own / "corral-w1")
    containment = cgroups.Containment([V2Hierarchy(own / "corral-w1", frozenset({"memory", "cpu", "pids"}))])
    containment.start()
    slot = own / "corral-w1" / "slot-1"
    _kernel_files(slot)
    group = containment.open(Limits(cpus=2))
    group.attach(4242)
    assert _open_under(tmp_path) == 1  # kept for the next join
    (slot / "cgroup.procs").write_text("")  # the attempt's processes are gone
    containment.close(group)
    assert containment._kept == [group]
    (slot / "memory.max").unlink()
    (slot / "memory.max").mkdir()  # the next limits cannot be written
    with pytest.raises(IsADirectoryError):
        containment.open(Limits(memory_bytes=512 * 1024 * 1024))
    assert _open_under(tmp_path) == 0
    assert containment._descriptors._left == cgroups.KEPT_DESCRIPTORS_MAX
