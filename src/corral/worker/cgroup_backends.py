"""The cgroup mechanisms behind ``corral.worker.cgroups``: one class per kind of hierarchy.

- ``V1Controller``: one controller of a cgroup v1 mount (``/sys/fs/cgroup/memory``, ``.../cpu``,
  ``.../pids``, ``.../devices``, ``.../freezer``, ``.../cpuacct``): its limit files, its OOM count, and
  for ``freezer`` the freeze that lets a kill reach every process of a tree that keeps forking.
- ``V2Hierarchy``: a cgroup v2 hierarchy (``/sys/fs/cgroup`` on a pure v2 host, or the hybrid's
  ``/sys/fs/cgroup/unified``): ``memory.max``, ``cpu.max``, ``pids.max`` where its controllers are
  enabled, and ``cgroup.kill`` (Linux 5.14) wherever the kernel has it, controllers or not.

Each one only reads and writes files under a directory it is given: the tests lay out a cgroupfs
tree in a temporary directory and drive the v2 backend against it.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from pathlib import Path

from corral.worker.cgroup_limits import Limits

#: the CFS period the CPU quota is a share of (100 ms, the kernel's default)
CPU_PERIOD_US = 100_000
#: how long a freeze may take to settle before the kill goes anyway
FREEZE_WAIT_S = 1.0


def write(path: Path | str, value: str) -> None:
    """One ``write`` of ``value`` (a cgroup file takes one value per write); os-level calls, since
    a job's start makes a few of these and ``open()``'s text layer cost more than the writes."""
    descriptor = os.open(path, os.O_WRONLY | os.O_TRUNC | os.O_CLOEXEC)
    try:
        os.write(descriptor, value.encode())
    finally:
        os.close(descriptor)


def read_counter(path: Path, name: str) -> int | None:
    """``name N`` from a flat keyed file (``memory.events``, ``memory.oom_control``); None when absent."""
    try:
        text = path.read_text()
    except OSError:
        return None
    for line in text.splitlines():
        key, _, value = line.partition(" ")
        if key == name:
            with contextlib.suppress(ValueError):
                return int(value)
    return None


def member_pids(group: Path | str) -> list[int]:
    """The processes of a cgroup (``group`` a directory, or the path of its ``cgroup.procs``)."""
    path = group if isinstance(group, str) else str(group / "cgroup.procs")
    try:
        descriptor = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return []
    try:
        chunks = []
        while chunk := os.read(descriptor, 65536):
            chunks.append(chunk)
    except OSError:
        return []
    finally:
        os.close(descriptor)
    return [int(line) for line in b"".join(chunks).split()]


def signal_members(group: Path, signal_number: int) -> None:
    for pid in member_pids(group):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal_number)


class V1Controller:
    """One v1 controller's hierarchy; ``base``: the worker's subtree in it."""

    def __init__(self, controller: str, base: Path) -> None:
        self.name = f"v1:{controller}"
        self.controller = controller
        self.base = base

    @property
    def provides(self) -> frozenset[str]:
        return frozenset({self.controller, "freeze"} if self.controller == "freezer" else {self.controller})

    def prepare(self) -> None:
        """The worker's subtree; a v1 cpuset child needs its parent's CPUs and memory nodes."""
        self.base.mkdir(exist_ok=True)

    def configure(self, group: Path, limits: Limits, previous: Limits | None) -> None:
        if self.controller == "memory":
            write(group / "memory.limit_in_bytes", str(limits.memory_bytes or -1))
        elif self.controller == "cpu":
            quota = -1 if not limits.cpus else int(limits.cpus * CPU_PERIOD_US)
            write(group / "cpu.cfs_period_us", str(CPU_PERIOD_US))
            write(group / "cpu.cfs_quota_us", str(quota))
        elif self.controller == "pids":
            write(group / "pids.max", str(limits.pids_max) if limits.pids_max else "max")
        elif self.controller == "devices":
            for major, minor in previous.denied_devices if previous is not None else ():
                write(group / "devices.allow", f"c {major}:{minor} rwm")
            for major, minor in limits.denied_devices:
                write(group / "devices.deny", f"c {major}:{minor} rwm")

    def oom_kills(self, group: Path) -> int | None:
        if self.controller != "memory":
            return None
        return read_counter(group / "memory.oom_control", "oom_kill")

    def needed(self, limits: Limits) -> bool:
        """Whether an attempt held to ``limits`` joins this controller's cgroup (the freezer is
        joined by the port when it is the one that kills the tree)."""
        return {
            "memory": limits.memory_bytes is not None,
            "cpu": bool(limits.cpus),
            "pids": limits.pids_max is not None,
            "devices": bool(limits.denied_devices),
        }.get(self.controller, False)

    def kill(self, group: Path) -> None:
        """Freeze, SIGKILL every member, thaw: a frozen tree cannot fork a child the kill misses."""
        if self.controller != "freezer":
            signal_members(group, signal.SIGKILL)
            return
        with contextlib.suppress(OSError):
            write(group / "freezer.state", "FROZEN")
            deadline = time.monotonic() + FREEZE_WAIT_S
            while (group / "freezer.state").read_text().strip() == "FREEZING" and time.monotonic() < deadline:
                time.sleep(0.005)
        signal_members(group, signal.SIGKILL)
        with contextlib.suppress(OSError):
            write(group / "freezer.state", "THAWED")


class V2Hierarchy:
    """A cgroup v2 hierarchy; ``base``: the worker's subtree; ``controllers``: those enabled for it."""

    def __init__(self, base: Path, controllers: frozenset[str]) -> None:
        self.name = "v2"
        self.base = base
        self.controllers = controllers & {"memory", "cpu", "pids"}

    @property
    def provides(self) -> frozenset[str]:
        kill = {"kill"} if self.has_kill() else set()
        return frozenset(self.controllers | kill)

    def has_kill(self) -> bool:
        """``cgroup.kill`` exists in non-root cgroups of a kernel >= 5.14: asked of the subtree."""
        return (self.base / "cgroup.kill").exists()

    def prepare(self) -> None:
        """The worker's subtree, with its controllers enabled for the attempts' cgroups below it.

        v2 lets a cgroup hand controllers to its children only while it holds no process itself:
        a worker alone in its cgroup (systemd's ``Delegate=yes``) first moves itself to a leaf of
        its own beside the subtree. Controllers that cannot be enabled are dropped (``none``)."""
        self.base.mkdir(exist_ok=True)
        if not self.controllers:
            return
        enabled = " ".join(f"+{name}" for name in sorted(self.controllers))
        try:
            try:
                write(self.base.parent / "cgroup.subtree_control", enabled)
            except OSError:
                leaf = self.base.parent / f"{self.base.name}-worker"
                leaf.mkdir(exist_ok=True)
                write(leaf / "cgroup.procs", str(os.getpid()))
                write(self.base.parent / "cgroup.subtree_control", enabled)
            write(self.base / "cgroup.subtree_control", enabled)
        except OSError:
            self.controllers = frozenset()

    def configure(self, group: Path, limits: Limits, previous: Limits | None) -> None:
        if "memory" in self.controllers:
            write(group / "memory.max", str(limits.memory_bytes) if limits.memory_bytes else "max")
            with contextlib.suppress(OSError):
                write(group / "memory.swap.max", "0" if limits.memory_bytes else "max")
        if "cpu" in self.controllers:
            quota = "max" if not limits.cpus else str(int(limits.cpus * CPU_PERIOD_US))
            write(group / "cpu.max", f"{quota} {CPU_PERIOD_US}")
        if "pids" in self.controllers:
            write(group / "pids.max", str(limits.pids_max) if limits.pids_max else "max")

    def oom_kills(self, group: Path) -> int | None:
        if "memory" not in self.controllers:
            return None
        return read_counter(group / "memory.events", "oom_kill")

    def needed(self, limits: Limits) -> bool:
        return bool(self.controllers) and (
            limits.memory_bytes is not None or bool(limits.cpus) or limits.pids_max is not None
        )

    def kill(self, group: Path) -> None:
        """``cgroup.kill``: the kernel kills every process of the cgroup at once, forks included."""
        try:
            write(group / "cgroup.kill", "1")
        except OSError:
            signal_members(group, signal.SIGKILL)
