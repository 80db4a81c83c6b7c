"""The worker's cgroup port on a real host (the GPU machine a session may borrow): what the host
mounts, what ``cgroups.detect`` picks, and each limit for real: an OOM kill counted by the kernel,
the CPU quota, the pids cap, the GPU device nodes, kill-the-tree. Standard library only: run it
from the repository root with any Python 3.11+, as root, no install:

    python3 bench/cgroup_check.py             # in the cgroup this process was started in
    python3 bench/cgroup_check.py --delegate  # first in a cgroup of its own under the v2 root,
                                              # as systemd's Delegate=yes starts the worker

Without ``--delegate`` on a v2 host whose cgroup holds other processes (a container, a login
session), v2 cannot hand controllers to the worker's subtree: the check then shows the worker's
honest fallback (``none`` for memory, CPU and pids; ``cgroup.kill`` still works).
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import pathlib
import platform
import subprocess
import sys
from typing import Any

sys.path.insert(0, "src")

from corral.worker import cgroups
from corral.worker.cgroup_limits import attempt_limits, gpu_device_numbers

#: the worker's start gate: the job waits for one byte, sent once it has joined its cgroup
START_GATE = (
    'read -r _; exec </dev/null; __corral_command=$1; shift; eval "unset __corral_command; $__corral_command"'
)
V2_ROOT = pathlib.Path("/sys/fs/cgroup")
BUSY = """import os, time
start = time.monotonic()
for _ in range(2):
    if os.fork() == 0:
        while time.monotonic() - start < 2:
            pass
        os._exit(0)
os.wait()
os.wait()
times = os.times()
print(round((times.children_user + times.children_system) / (time.monotonic() - start), 2))
"""
PROBE = (
    "for f in /dev/nvidia0 /dev/nvidiactl; do"
    " if head -c 0 $f 2>/dev/null; then echo $f open; else echo $f denied; fi; done"
)


def delegate() -> pathlib.Path:
    """Move this process into a cgroup of its own under the v2 root (what systemd does for a unit
    with ``Delegate=yes``), with the root's controllers available to it."""
    own = V2_ROOT / f"corral-check-{os.getpid()}"
    own.mkdir()
    (own / "cgroup.procs").write_text(str(os.getpid()))
    return own


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--delegate", action="store_true")
    args = parser.parse_args()
    own = delegate() if args.delegate else None
    print("python", platform.python_version(), "uid", os.geteuid(), "kernel", platform.release())
    print("cgroup:", pathlib.Path("/proc/self/cgroup").read_text().strip().replace("\n", " | "))
    mounts = [
        line.split()[4] + " " + line.split(" - ")[1].split()[0]
        for line in pathlib.Path("/proc/self/mountinfo").read_text().splitlines()
        if "cgroup" in line
    ]
    print("mounts:", mounts)
    print("nvidia nodes:", sorted(glob.glob("/dev/nvidia*")))
    containment, line = cgroups.detect(cgroups.subtree_name("check", pathlib.Path("/tmp/cgroup-check")))
    print("detect:", line)
    if containment is None:
        return
    print("killed at start:", containment.start())
    print("enforcement:", json.dumps(containment.enforcement))
    devices = gpu_device_numbers()
    print("gpu devices:", devices)

    def job(command: str, limits: Any, out: int = subprocess.PIPE) -> tuple[Any, subprocess.Popen[bytes]]:
        group = containment.open(limits)
        read_end, write_end = os.pipe()
        process = subprocess.Popen(
            ["/bin/sh", "-c", START_GATE, "sh", command],
            stdin=read_end,
            start_new_session=True,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
        os.close(read_end)
        group.attach(process.pid)
        os.write(write_end, b"\n")
        os.close(write_end)
        return group, process

    # 1. memory: three times the limit, an OOM kill the kernel counts
    hog = f"{sys.executable} -c 'x = bytearray(300 * 1024 * 1024)'"
    group, process = job(hog, attempt_limits(100, 0, [], None, 1000, devices))
    process.communicate(timeout=60)
    joined = [hierarchy.name for hierarchy, _ in group.joined]
    print("oom: exit", process.returncode, "oom_killed", group.oom_killed(), "joined", joined)
    containment.close(group)
    # 2. the CPU quota: two busy processes under cpus=1, then without a quota
    pathlib.Path("/tmp/cgroup-check-busy.py").write_text(BUSY)
    for cpus in (1, 0):
        group, process = job(
            f"{sys.executable} /tmp/cgroup-check-busy.py", attempt_limits(0, cpus, [], None, 1000, devices)
        )
        print(f"cores used with cpus={cpus}:", process.communicate(timeout=60)[0].decode().strip())
        containment.close(group)
    # 3. the pids cap
    forks = "for i in $(seq 1 50); do sleep 5 & done 2>&1 | tail -1; wait"
    group, process = job(forks, attempt_limits(0, 0, [], None, 20, devices))
    print("pids cap 20:", process.communicate(timeout=60)[0].decode().strip()[-200:])
    containment.close(group)
    # 4. the GPU device nodes: a job without GPUs, then one with GPU 0
    for gpus in ([], [0]):
        group, process = job(PROBE, attempt_limits(0, 0, gpus, None, 1000, devices))
        print("gpus", gpus, ":", process.communicate(timeout=60)[0].decode().split("\n"))
        containment.close(group)
    # 5. kill the tree: a re-sessioned child and a double fork outlive the job's own exit
    detached = "setsid -f sleep 300; (sleep 301 &); sleep 0.5"
    group, process = job(detached, attempt_limits(0, 0, [], None, 1000, devices), subprocess.DEVNULL)
    process.wait(timeout=60)
    left = group.pids()
    print("left after exit:", left, "killed:", group.kill(), "after kill:", group.pids())
    containment.close(group)
    containment.shutdown()
    if own is not None:
        (V2_ROOT / "cgroup.procs").write_text(str(os.getpid()))
        for leaf in sorted(own.iterdir(), reverse=True):
            if leaf.is_dir():
                leaf.rmdir()
        own.rmdir()


if __name__ == "__main__":
    main()
