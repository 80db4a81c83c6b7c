"""A cgroup per attempt, behind one port: ``Containment`` opens an ``AttemptGroup`` for each attempt
and takes it back when the attempt ends; the mechanisms are ``corral.worker.cgroup_backends``.

Which mechanism does what is decided once, at start, from the host (``detect``): a controller is
used where this process's own cgroup in its hierarchy is writable (``memory``, ``cpu``, ``pids``,
``devices``, ``freezer``, ``cpuacct`` from v1 where the host mounts them there; ``memory``, ``cpu``,
``pids`` from v2 where they are enabled), v1 first where a host has both. Kill-the-tree is v2's
``cgroup.kill`` wherever the kernel has it, even in a v2 hierarchy without controllers (a hybrid
host's ``/sys/fs/cgroup/unified``), else a v1 freeze and kill. Whatever is missing is ``"none"`` in
``enforcement`` (reported at register and in every heartbeat) and the job runs without it: a host
without cgroups still runs jobs, and says so in one line at start.

The worker's cgroups live in a subtree of its own, ``corral-<worker id>``, under its own cgroup in
each hierarchy. Attempt cgroups are kept for the next attempt once empty (``slot-N``): creating and
removing one directory in each of six hierarchies per job was a third of a short job's cost to the
worker; a kept one has its limits rewritten, and its OOM counter is read as a difference. A worker
that starts kills what is left in its subtree (a killed predecessor's attempts) and removes it.

Processes join before they run anything: the job starts as a shell that waits for one byte on a
pipe (``start_gate``), the worker writes its pid into every hierarchy's cgroup, then sends the byte;
so not even the job's first fork escapes its cgroup.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import logging
import os
import re
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Protocol

from corral.worker.cgroup_backends import V1Controller, V2Hierarchy, member_pids, write
from corral.worker.cgroup_limits import Limits

logger = logging.getLogger("corral.worker.cgroups")

#: the mechanisms API.md's ``enforcement`` names, each from what the hierarchies provide
ENFORCEMENT_KEYS = ("memory", "cpu", "pids", "devices", "kill_tree")
V1_CONTROLLERS = ("memory", "cpu", "pids", "devices", "freezer")
#: after a kill, how long the cgroup may take to empty before the worker says so
EMPTY_WAIT_S = 5.0
#: the most empty attempt cgroups kept for the next attempts
KEPT_MAX = 64
#: the most ``cgroup.procs`` descriptors kept open for the attempts' joins (``AttemptGroup.attach``):
#: the kept slots each joining four hierarchies (a CPU quota, a pids cap, a memory limit and the
#: one that kills the tree), a quarter of the 1,024 descriptors a service gets by default
KEPT_DESCRIPTORS_MAX = 256
_SAFE = re.compile(r"[^A-Za-z0-9_.-]")


class JoinError(OSError):
    """The host refused to move a job's process into its cgroup."""


class Hierarchy(Protocol):
    name: str
    base: Path

    @property
    def provides(self) -> frozenset[str]: ...

    def prepare(self) -> None: ...

    def configure(self, group: Path, limits: Limits, previous: Limits | None) -> None: ...

    def oom_kills(self, group: Path) -> int | None: ...

    def needed(self, limits: Limits) -> bool: ...

    def kill(self, group: Path) -> None: ...


class DescriptorBudget:
    """How many more descriptors the worker's attempt cgroups may keep open, shared by them all."""

    def __init__(self, limit: int = KEPT_DESCRIPTORS_MAX) -> None:
        self._left = limit
        self._lock = threading.Lock()

    def take(self) -> bool:
        with self._lock:
            if self._left <= 0:
                return False
            self._left -= 1
            return True

    def give(self, count: int) -> None:
        with self._lock:
            self._left += count


class AttemptGroup:
    """One attempt's cgroups: a directory of the same name in every hierarchy, of which the attempt
    joins those its limits need (``configure``) and always the one that kills the tree.

    Why not all of them: moving a process into a cgroup is a kernel migration under a global lock,
    and a short job that joined six v1 hierarchies cost its worker half as much again; a job
    without a memory limit or a CPU quota stays in the worker's cgroup of those controllers."""

    def __init__(
        self,
        name: str,
        directories: Sequence[tuple[Hierarchy, Path]],
        kill_by: Hierarchy | None,
        budget: DescriptorBudget | None = None,
    ):
        self.name = name
        self.directories = list(directories)
        self._kill_by = kill_by
        self.limits: Limits | None = None
        self._written: dict[str, Limits] = {}  # by hierarchy: what the slot's files hold (kept slots)
        self.joined: list[tuple[Hierarchy, Path]] = list(self.directories)
        self._procs: list[str] = [str(directory / "cgroup.procs") for _h, directory in self.joined]
        self._oom_baseline = 0
        self._budget = budget
        self._writers: dict[str, int] = {}  # cgroup.procs -> a descriptor kept open for joins

    def configure(self, limits: Limits) -> None:
        joined = [(h, d) for h, d in self.directories if h is self._kill_by or h.needed(limits)]
        if joined != self.joined:
            self.joined = joined
            self._procs = [str(directory / "cgroup.procs") for _h, directory in joined]
        for hierarchy, directory in self.joined:
            written = self._written.get(hierarchy.name)
            if written != limits:
                hierarchy.configure(directory, limits, written)
                self._written[hierarchy.name] = limits
        self.limits = limits
        self._oom_baseline = self._oom_count()

    def attach(self, pid: int) -> None:
        """Put ``pid`` in the attempt's cgroups (before it runs anything).

        Each ``cgroup.procs`` is written through a descriptor the group keeps while the budget
        allows (``release`` closes them): every write is a move, whatever was written before. Why:
        an open and a close per hierarchy per job were each a hand-over of the interpreter's lock
        between the worker's threads (``bench/e2e.py``: the worker's CPU per job, see its README)."""
        value = str(pid).encode()
        for procs in self._procs:
            try:
                descriptor = self._writers.get(procs)
                if descriptor is None and self._budget is not None and self._budget.take():
                    try:
                        descriptor = os.open(procs, os.O_WRONLY | os.O_CLOEXEC)
                    except OSError:
                        self._budget.give(1)
                        raise
                    self._writers[procs] = descriptor
                if descriptor is None:
                    write(procs, str(pid))
                else:
                    os.pwrite(descriptor, value, 0)
            except OSError as error:
                raise JoinError(error.errno, f"cannot join {procs}: {error.strerror}") from error

    def release(self) -> None:
        """Close the descriptors ``attach`` kept (before the group's directories are removed)."""
        writers, self._writers = self._writers, {}
        for descriptor in writers.values():
            with contextlib.suppress(OSError):
                os.close(descriptor)
        if writers and self._budget is not None:
            self._budget.give(len(writers))

    def _oom_count(self) -> int:
        if self.limits is None or self.limits.memory_bytes is None:
            return 0
        counts = [hierarchy.oom_kills(directory) for hierarchy, directory in self.joined]
        return sum(count for count in counts if count is not None)

    def oom_killed(self) -> bool:
        """The kernel's OOM killer killed a process of the attempt (its own count, not a guess)."""
        return self._oom_count() > self._oom_baseline

    def pids(self) -> list[int]:
        """The live members (the view of a cgroup the attempt joined: each holds them all)."""
        return member_pids(self._procs[0]) if self._procs else []

    def kill(self) -> bool:
        """Kill every process of the attempt, however it detached; True once none is left."""
        if not self.joined:
            return True
        by = [(h, d) for h, d in self.joined if h is self._kill_by] or self.joined[:1]
        by[0][0].kill(by[0][1])
        deadline = time.monotonic() + EMPTY_WAIT_S
        while self.pids():
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.01)
        return True


class Containment:
    """The worker's cgroups: what it enforces, and one ``AttemptGroup`` per running attempt."""

    def __init__(self, hierarchies: Sequence[Hierarchy]) -> None:
        self.hierarchies = list(hierarchies)
        self._provided: dict[str, Hierarchy] = {}  # known once ``start`` made the subtrees
        self._kill_by: Hierarchy | None = None
        self._lock = threading.Lock()
        self._kept: list[AttemptGroup] = []
        self._count = 0
        self._descriptors = DescriptorBudget()

    @property
    def enforcement(self) -> dict[str, str]:
        """API.md's ``enforcement`` less ``identity``: the mechanism of each, or ``none``."""

        def mechanism(what: str) -> str:
            hierarchy = self._provided.get(what)
            return "none" if hierarchy is None else ("cgroup_v2" if hierarchy.name == "v2" else "cgroup_v1")

        kill = "none"
        if "kill" in self._provided:
            kill = "cgroup_v2_kill"
        elif "freeze" in self._provided:
            kill = "cgroup_v1_freezer"
        return {**{what: mechanism(what) for what in ("memory", "cpu", "pids", "devices")}, "kill_tree": kill}

    def start(self) -> list[int]:
        """Make the worker's subtrees and clear what a killed predecessor left in them; the pids
        of its processes that were killed."""
        killed: list[int] = []
        for hierarchy in self.hierarchies:
            hierarchy.prepare()
        for hierarchy in self.hierarchies:
            for what in hierarchy.provides:
                self._provided.setdefault(what, hierarchy)
        self._kill_by = self._provided.get("kill") or self._provided.get("freeze")
        for name in sorted({child.name for h in self.hierarchies for child in _children(h.base)}):
            group = self._group(name)  # a predecessor's: every hierarchy's directory is looked at
            killed += [pid for _h, directory in group.directories for pid in member_pids(directory)]
            if not group.kill():
                logger.error("processes of a previous run survived its cgroup's kill", extra={"cgroup": name})
            _remove(group)
        return sorted(set(killed))

    def _group(self, name: str) -> AttemptGroup:
        return AttemptGroup(
            name, [(h, h.base / name) for h in self.hierarchies], self._kill_by, self._descriptors
        )

    def open(self, limits: Limits) -> AttemptGroup:
        """A cgroup for an attempt held to ``limits``: a kept one, else a new one. One that cannot
        be made or held to ``limits`` (the error goes to the caller) is removed, with the
        descriptors it kept: nothing else holds it any more."""
        with self._lock:
            group = self._kept.pop() if self._kept else None
            if group is None:
                self._count += 1
                name = f"slot-{self._count}"
        try:
            if group is None:
                group = self._group(name)
                for _hierarchy, directory in group.directories:
                    directory.mkdir(exist_ok=True)
            group.configure(limits)
        except BaseException:
            if group is not None:
                _remove(group)
            raise
        return group

    def close(self, group: AttemptGroup) -> None:
        """The attempt ended (its processes are gone): kept for the next, or removed."""
        if group.pids() and not group.kill():
            logger.error("an attempt's cgroup could not be emptied", extra={"cgroup": group.name})
            group.release()
            return
        with self._lock:
            if len(self._kept) < KEPT_MAX:
                self._kept.append(group)
                return
        _remove(group)

    def shutdown(self) -> None:
        with self._lock:
            kept, self._kept = self._kept, []
        for group in kept:
            _remove(group)
        for hierarchy in self.hierarchies:
            with contextlib.suppress(OSError):
                hierarchy.base.rmdir()


def _children(base: Path) -> list[Path]:
    try:
        return [child for child in base.iterdir() if child.is_dir()]
    except OSError:
        return []


#: how long a removal waits for the processes just killed to be released (a cgroup whose last
#: process is still exiting refuses ``rmdir`` with EBUSY)
REMOVE_WAIT_S = 2.0


def _remove(group: AttemptGroup) -> None:
    group.release()
    deadline = time.monotonic() + REMOVE_WAIT_S
    for _hierarchy, directory in group.directories:
        while True:
            try:
                directory.rmdir()
            except FileNotFoundError:
                break
            except OSError as error:
                if error.errno != errno.EBUSY or time.monotonic() >= deadline:
                    logger.warning(
                        "cannot remove a cgroup", extra={"cgroup": str(directory), "error": str(error)}
                    )
                    break
                time.sleep(0.01)
                continue
            break


# --- detection --------------------------------------------------------------------------------


def _own_paths(text: str) -> tuple[dict[str, str], str | None]:
    """From ``/proc/self/cgroup``: v1 controller -> this process's path, and its v2 path."""
    v1: dict[str, str] = {}
    v2 = None
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _number, controllers, path = parts
        if controllers == "":
            v2 = path
        for controller in controllers.split(","):
            v1[controller] = path
    return v1, v2


def _mounts(text: str) -> tuple[dict[str, tuple[str, str]], tuple[str, str] | None]:
    """From ``/proc/self/mountinfo``: v1 controller -> (mount root, mount point), and v2's."""
    v1: dict[str, tuple[str, str]] = {}
    v2 = None
    for line in text.splitlines():
        fields = line.split()
        if " - " not in line or len(fields) < 5:
            continue
        after = line.split(" - ", 1)[1].split()
        if len(after) < 3:
            continue
        fstype, options = after[0], after[2].split(",")
        root, point = fields[3], fields[4]
        if fstype == "cgroup2":
            v2 = (root, point)
        elif fstype == "cgroup":
            for option in options:
                if option in V1_CONTROLLERS:
                    v1[option] = (root, point)
    return v1, v2


def _directory(mount: tuple[str, str], own: str) -> Path:
    root, point = mount
    relative = own[len(root) :] if root != "/" and own.startswith(root) else own
    return Path(point) / relative.lstrip("/")


def _writable(directory: Path) -> bool:
    return directory.is_dir() and os.access(directory, os.W_OK)


def subtree_name(worker_id: str, state_dir: Path) -> str:
    """``corral-<id>-<hash of the state directory>``: the worker's subtree, which only it (the one
    worker of that id and state directory, ``corral.worker.state_lock``) and its successors use."""
    digest = hashlib.blake2b(str(state_dir.resolve()).encode(), digest_size=4).hexdigest()
    return f"corral-{_SAFE.sub('_', worker_id)[:64]}-{digest}"


def detect(subtree: str, proc: Path = Path("/proc/self")) -> tuple[Containment | None, str]:
    """The host's mechanisms for this worker (``subtree``: ``subtree_name``), and a line saying
    what they are."""
    try:
        own_v1, own_v2 = _own_paths((proc / "cgroup").read_text())
        mounts_v1, mount_v2 = _mounts((proc / "mountinfo").read_text())
    except OSError as error:
        return None, f"no cgroups: {error}"
    hierarchies: list[Hierarchy] = []
    for controller in V1_CONTROLLERS:
        if controller in mounts_v1 and controller in own_v1:
            directory = _directory(mounts_v1[controller], own_v1[controller])
            if _writable(directory):
                hierarchies.append(V1Controller(controller, directory / subtree))
    if mount_v2 is not None and own_v2 is not None:
        directory = _directory(mount_v2, own_v2)
        if _writable(directory):
            try:
                available = frozenset((directory / "cgroup.controllers").read_text().split())
            except OSError:
                available = frozenset()
            taken = {h.controller for h in hierarchies if isinstance(h, V1Controller)}
            hierarchies.append(V2Hierarchy(directory / subtree, available - taken))
    if not hierarchies:
        return None, "no writable cgroup hierarchy: jobs run without limits"
    return Containment(hierarchies), "cgroup hierarchies: " + ", ".join(h.name for h in hierarchies)
