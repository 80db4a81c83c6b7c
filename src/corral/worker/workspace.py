"""A job's private directory and the environment it runs with.

Every attempt gets a fresh temporary directory for the files corral hands to the job (the beat
file, where a checkpoint goes, the stored checkpoint to resume from, for a gang rank the
directory of every rank's checkpoint, and the two files of a preemption's checkpoint phase: the one
the job touches when the save SIGUSR1 asked for is complete, and the one it writes a number of
seconds to when it needs more time); it is removed when the attempt ends, so nothing of one attempt
leaks into the next or piles up on the host.

An attempt that left its directory empty (most do) hands it on to the next attempt instead
(``WorkspacePool``): creating and removing a directory are two journaled metadata updates of the
file system (about 0.2 ms of a short job's cost to the worker on ext4), where seeing that a
directory is empty is one read. Only an empty directory is handed on, so nothing of one attempt
reaches the next; the few kept are removed when the worker exits.
"""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
import threading
from collections.abc import Mapping, Sequence
from functools import cache
from pathlib import Path

from corral.worker import identity
from corral.worker.identity import Account


def visible_devices(gpu_indices: Sequence[int]) -> str:
    """``CUDA_VISIBLE_DEVICES`` for the GPUs the server gave the job; empty for a job without GPUs
    (an empty value hides every GPU, where an unset one would expose them all)."""
    return ",".join(str(index) for index in gpu_indices)


@cache
def _base_environment(account: Account) -> dict[str, str]:
    """The same for every job of an account (the worker's environment does not change): built once."""
    return identity.base_environment(account)


#: the most empty directories a worker keeps for the next attempts (about the jobs it starts at once)
POOLED_MAX = 64


class WorkspacePool:
    """Empty job directories kept for the next attempts of this process."""

    def __init__(self, limit: int = POOLED_MAX) -> None:
        self._limit = limit
        self._lock = threading.Lock()
        self._empty: list[str] = []

    def take(self) -> str:
        """An empty directory: a kept one, else a new one."""
        with self._lock:
            if self._empty:
                return self._empty.pop()
        return tempfile.mkdtemp(prefix="corral-job-")

    def give_back(self, directory: str) -> None:
        """Keep ``directory`` when it is empty and there is room, else remove it with what it holds."""
        try:
            empty = not os.listdir(directory)
        except OSError:
            empty = False
        if empty:
            with self._lock:
                if len(self._empty) < self._limit:
                    self._empty.append(directory)
                    return
        try:
            os.rmdir(directory)
        except OSError:
            shutil.rmtree(directory, ignore_errors=True)

    def clear(self) -> None:
        """Remove the kept directories (at exit, and in tests)."""
        with self._lock:
            empty, self._empty = self._empty, []
        for directory in empty:
            shutil.rmtree(directory, ignore_errors=True)


#: the worker's one pool
pool = WorkspacePool()
atexit.register(pool.clear)


class JobWorkspace:
    """``job_id`` and ``attempt`` no longer name the directory (a kept one served an earlier
    attempt): the job's log lines tie its paths to it."""

    def __init__(self, job_id: str, attempt: int) -> None:
        self._name: str | None = pool.take()
        self.directory = Path(self._name)
        self.beat_file = self.directory / "beat"
        self.checkpoint_out = self.directory / "checkpoint.out"
        self.checkpoint_in = self.directory / "checkpoint.in"
        self.gang_checkpoint_dir = self.directory / "gang-checkpoints"
        self.checkpoint_done_file = self.directory / "checkpoint.done"
        self.defer_file = self.directory / "defer"

    def environment(
        self,
        claim_env: Mapping[str, str],
        gpu_indices: Sequence[int],
        has_checkpoint_in: bool,
        account: Account | None = None,
    ) -> dict[str, str]:
        """What the job gets of the host (``identity.base_environment``: never the worker's token),
        then the claim's ``env``, then the variables the worker owns.

        A gang rank (the claim has ``CORRAL_GANG_ID``) always gets ``CORRAL_GANG_CHECKPOINT_DIR``,
        created here, empty when no rank has a checkpoint yet: a job can test for a file in it
        without first testing the variable.
        """
        base = _base_environment(account or identity.worker_account())
        environment = {**base, **{str(key): str(value) for key, value in claim_env.items()}}
        environment["CUDA_VISIBLE_DEVICES"] = visible_devices(gpu_indices)
        # CUDA's default order (fastest first) differs from NVML's (PCI bus), which the server's
        # indices and the GPU sampler use.
        environment["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
        environment["CORRAL_BEAT_FILE"] = str(self.beat_file)
        environment["CORRAL_CHECKPOINT_OUT"] = str(self.checkpoint_out)
        environment["CORRAL_CHECKPOINT_DONE_FILE"] = str(self.checkpoint_done_file)
        environment["CORRAL_DEFER_FILE"] = str(self.defer_file)
        if has_checkpoint_in:
            environment["CORRAL_CHECKPOINT_IN"] = str(self.checkpoint_in)
        else:
            environment.pop("CORRAL_CHECKPOINT_IN", None)
        if claim_env.get("CORRAL_GANG_ID"):
            self.gang_checkpoint_dir.mkdir(exist_ok=True)
            environment["CORRAL_GANG_CHECKPOINT_DIR"] = str(self.gang_checkpoint_dir)
        else:
            environment.pop("CORRAL_GANG_CHECKPOINT_DIR", None)
        return environment

    def remove(self) -> None:
        """The attempt ended: its directory goes back to the pool when it is empty, else is removed."""
        # Idempotent: a directory given back twice would be handed to two attempts.
        name, self._name = self._name, None
        if name is not None:
            pool.give_back(name)
