"""The resident memory of a job's process tree, through psutil.

The tree is the job's first process (its process group leader, the ``/bin/sh -c``) and all its
descendants: a launcher's workers and data loaders count, because a model load or a data-loader
refill shows up in any of them. A process that vanishes between the listing and its read is skipped
(the tree changes while we look); a root that is gone is "no reading".

Resident set size (RSS) is the figure, not unique memory (USS): RSS is one cheap read of
``/proc/<pid>/statm`` per process, and the watchdogs only compare a tree with itself over a window,
so memory shared between its processes moving or not is what matters, counted twice or not.
"""

from __future__ import annotations

import psutil

from corral.worker.samplers import MIB, TreeReading

_GONE = (psutil.NoSuchProcess, psutil.ZombieProcess, psutil.AccessDenied)


class ProcessTreeSampler:
    def read(self, root_pid: int) -> TreeReading | None:
        try:
            root = psutil.Process(root_pid)
            members = [root, *root.children(recursive=True)]
        except _GONE:
            return None
        total = 0
        pids = set()
        for member in members:
            try:
                total += member.memory_info().rss
            except _GONE:
                continue
            pids.add(member.pid)
        if not pids:
            return None
        return TreeReading(memory_mb=total / MIB, pids=frozenset(pids))
