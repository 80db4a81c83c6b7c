"""A cgroup per attempt on a real host (issue 21): memory, CPU, GPU device nodes, and nothing an
attempt started outlives it, however it detached. Needs root and a writable cgroup hierarchy."""

from __future__ import annotations

import os
import stat
import sys
from pathlib import Path

import pytest

from corral.client import Client
from corral.worker import cgroups
from tests.e2e.conftest import FAST_SERVER_FLAGS, process_gone, wait_for, wait_status

pytestmark = pytest.mark.e2e


def _has_cgroups() -> bool:
    containment, _ = cgroups.detect("corral-probe")
    return os.geteuid() == 0 and containment is not None


needs_cgroups = pytest.mark.skipif(not _has_cgroups(), reason="needs root and a writable cgroup hierarchy")

#: a job that leaves two processes behind that are in neither its process group nor its tree:
#: one re-sessioned (setsid -f), one double-forked (its parent exits at once); each writes its pid
DETACH = (
    "setsid -f sh -c 'echo $$ > {out}/setsid; exec sleep 300'; "
    "(sh -c 'echo $$ > {out}/forked; exec sleep 301' &); "
    "while [ ! -s {out}/setsid ] || [ ! -s {out}/forked ]; do sleep 0.05; done"
)


def _written(out: Path) -> bool:
    """Both strays have written their pids (each writes its own file, in no given order)."""
    return all((out / name).exists() and (out / name).read_text().strip() for name in ("setsid", "forked"))


def _pids(out: Path) -> list[int]:
    return [int((out / name).read_text()) for name in ("setsid", "forked")]


@needs_cgroups
@pytest.mark.parametrize("end", ["done", "cancel", "budget"])
def test_nothing_an_attempt_started_outlives_it(server, client: Client, start_worker, tmp_path: Path, end):
    start_worker(server.url, "w1")
    tail = {"done": "", "cancel": "; sleep 60", "budget": "; sleep 60"}[end]
    body = {"command": DETACH.format(out=tmp_path) + tail, "max_retries": 1}
    if end == "budget":
        body["budget_s"] = 1
    job = client.submit_body(body)["id"]
    wait_for(lambda: _written(tmp_path), 15, "the strays")
    pids = _pids(tmp_path)
    if end == "cancel":
        client.cancel(job)
    ended = wait_status(client, job, {"done", "failed", "cancelled", "pending"}, 30)
    # By the time the server heard of the end, the worker had killed every process of the attempt.
    assert all(process_gone(pid) for pid in pids), (ended["status"], pids)


@needs_cgroups
def test_a_job_over_its_memory_is_oom_killed_and_its_neighbour_runs_on(
    server, client: Client, start_worker, tmp_path: Path
):
    start_worker(server.url, "w1")
    neighbour = client.submit_body(
        {"command": f"touch {tmp_path}/n; sleep 4", "resources": {"memory_mb": 64}}
    )["id"]
    wait_for(lambda: (tmp_path / "n").exists(), 15, "the neighbour to start")
    greedy = client.submit_body(
        {
            "command": f"{sys.executable} -c 'x = bytearray(192 * 1024 * 1024)'",
            "resources": {"memory_mb": 64},
            "max_retries": 1,
        }
    )["id"]
    failed = wait_status(client, greedy, {"done", "failed"}, 30)
    assert (failed["status"], failed["reason"]["code"]) == ("failed", "oom_killed"), failed
    assert client.get_job(neighbour)["status"] == "running"
    assert wait_status(client, neighbour, {"done", "failed"}, 20)["status"] == "done"


@needs_cgroups
def test_a_job_opens_only_the_gpu_device_nodes_it_was_given(
    server, client: Client, start_worker, tmp_path: Path
):
    devices = tmp_path / "dev"
    devices.mkdir()
    # Stand-ins for /dev/nvidia0 and /dev/nvidia1 (null's and zero's numbers), and nvidiactl.
    for name, minor in (("nvidia0", 3), ("nvidia1", 5), ("nvidiactl", 7)):
        os.mknod(devices / name, 0o666 | stat.S_IFCHR, os.makedev(1, minor))
    start_worker(
        server.url, "w1", "--gpus", "2", "--vram-mb", "1000", "--gpu-model", "Fake", "--gpu-sampler", "none",
        "--gpu-devices", str(devices / "nvidia[0-9]*"),
    )  # fmt: skip
    probe = (
        'for n in 0 1; do if head -c 1 {dev}/nvidia$n > /dev/null 2>&1; then echo "$n ok"; '
        'else echo "$n denied"; fi; done > {out}; '
        "head -c 1 {dev}/nvidiactl > /dev/null && echo ctl >> {out}; "
        'echo "given $CUDA_VISIBLE_DEVICES" >> {out}'
    )
    job = client.submit_body(
        {"command": probe.format(dev=devices, out=tmp_path / "seen"), "resources": {"gpus": 1}}
    )["id"]
    assert wait_status(client, job, {"done", "failed"}, 20)["status"] == "done"
    lines = (tmp_path / "seen").read_text().split("\n")
    given = lines[-2].split()[1]
    other = "1" if given == "0" else "0"
    assert f"{given} ok" in lines and f"{other} denied" in lines and "ctl" in lines, lines


@needs_cgroups
def test_enforcement_is_reported_and_a_host_without_says_none(server, client: Client, start_worker):
    start_worker(server.url, "held")
    start_worker(server.url, "bare", "--containment", "none")
    workers = wait_for(
        lambda: (found := {w["id"]: w for w in client.workers()}) and len(found) == 2 and found, 15, "workers"
    )
    assert workers["held"]["enforcement"]["memory"] != "none"
    assert workers["held"]["enforcement"]["kill_tree"] != "none"
    assert {key: value for key, value in workers["bare"]["enforcement"].items() if key != "identity"} == {
        "memory": "none", "cpu": "none", "pids": "none", "devices": "none", "kill_tree": "none",
    }  # fmt: skip
    job = client.submit_body({"command": "true", "constraints": {"labels": {}}})["id"]
    assert wait_status(client, job, {"done", "failed"}, 20)["status"] == "done"


BUSY = """
import os, sys, time
start = time.monotonic()
children = []
for _ in range(2):
    pid = os.fork()
    if pid == 0:
        while time.monotonic() - start < 1.5:
            pass
        os._exit(0)
    children.append(pid)
for pid in children:
    os.waitpid(pid, 0)
used = os.times().children_user + os.times().children_system
with open(sys.argv[1], "w") as out:
    out.write(str(used / (time.monotonic() - start)))
"""


@needs_cgroups
def test_a_job_with_one_cpu_uses_at_most_about_one_core(server, client: Client, start_worker, tmp_path: Path):
    """Two busy processes for 1.5 s under ``cpus: 1``: the quota holds them to one core between
    them (the bound is only an upper one: a busy machine gives them less, never more)."""
    start_worker(server.url, "w1")
    (tmp_path / "busy.py").write_text(BUSY)
    job = client.submit_body(
        {"command": f"{sys.executable} {tmp_path}/busy.py {tmp_path}/cores", "resources": {"cpus": 1}}
    )["id"]
    assert wait_status(client, job, {"done", "failed"}, 30)["status"] == "done"
    assert float((tmp_path / "cores").read_text()) <= 1.25


@needs_cgroups
def test_nothing_a_preempted_attempt_started_outlives_it(start_server, start_worker, tmp_path: Path):
    server = start_server(*FAST_SERVER_FLAGS)
    start_worker(
        server.url, "w1", "--gpus", "1", "--vram-mb", "1000", "--gpu-model", "Fake", "--gpu-sampler", "none"
    )
    with Client(server.url) as client:
        low = client.submit_body(
            {
                "command": DETACH.format(out=tmp_path) + "; sleep 60",
                "resources": {"gpus": 1},
                "preemption_class": 2,
            }
        )["id"]
        wait_for(lambda: _written(tmp_path), 15, "the strays")
        pids = _pids(tmp_path)
        high = client.submit_body({"command": "true", "resources": {"gpus": 1}, "preemption_class": 7})["id"]
        wait_for(lambda: client.get_job(low)["preempted_count"] == 1, 20, "the preemption")
        assert all(process_gone(pid) for pid in pids), pids
        wait_status(client, high, {"done"}, 20)
        client.cancel(low)


def _open_under(directory: str) -> int:
    """How many of this process's descriptors are open on a file whose path contains ``directory``
    (other threads' descriptors do not count)."""
    count = 0
    for name in os.listdir("/proc/self/fd"):
        try:
            count += directory in os.readlink(f"/proc/self/fd/{name}")
        except OSError:
            continue
    return count


def _cgroup_paths(pid: int) -> list[str]:
    """The cgroup paths ``pid`` is in, one per hierarchy (``/proc/PID/cgroup``)."""
    return [line.split(":", 2)[2] for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines()]


@needs_cgroups
@pytest.mark.parametrize("budget", [cgroups.KEPT_DESCRIPTORS_MAX, 0])
def test_a_kept_slot_moves_each_attempt_into_its_cgroups(budget: int):
    """Attempt after attempt in one kept slot, every process lands in each cgroup it joins, whether
    the slot writes through the descriptors it kept from the first attempt or (no budget left)
    opens ``cgroup.procs`` each time; removing the slot closes what it kept."""
    import subprocess

    from corral.worker.cgroup_limits import Limits

    subtree = f"corral-kept-{os.getpid()}"
    containment, _ = cgroups.detect(subtree)
    assert containment is not None
    containment.start()
    containment._descriptors = cgroups.DescriptorBudget(budget)
    try:
        groups = []
        for _attempt in range(3):
            group = containment.open(Limits(cpus=1, pids_max=64))
            process = subprocess.Popen(["sleep", "60"])
            try:
                group.attach(process.pid)
                inside = [
                    path for path in _cgroup_paths(process.pid) if path.endswith(f"/{subtree}/{group.name}")
                ]
                assert len(inside) == len(group.joined) >= 1
            finally:
                process.kill()
                process.wait()
            containment.close(group)
            groups.append(group)
        assert all(group is groups[0] for group in groups)  # one slot, kept and used again
        assert _open_under(subtree) == (len(groups[0].joined) if budget else 0)
    finally:
        containment.shutdown()
    assert _open_under(subtree) == 0
