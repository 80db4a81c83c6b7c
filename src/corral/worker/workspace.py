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
import contextlib
import os
import shutil
import stat
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
    """Empty job directories kept for the next attempts of this process; ``parent``: where they are
    made (None: the temporary directory)."""

    def __init__(self, limit: int = POOLED_MAX, parent: str | None = None) -> None:
        self._limit = limit
        self._parent = parent
        self._lock = threading.Lock()
        self._empty: list[str] = []

    def take(self) -> str:
        """An empty directory: a kept one, else a new one."""
        with self._lock:
            if self._empty:
                return self._empty.pop()
        return tempfile.mkdtemp(prefix="corral-job-", dir=self._parent)

    def give_back(self, directory: str) -> None:
        """Keep ``directory`` when it is empty and there is room, else remove it with what it holds.
        One a job's account owned is the worker's again first: its job can add nothing after the
        look that finds it empty."""
        try:
            if self._parent is not None and os.stat(directory).st_uid != os.getuid():
                os.chown(directory, os.getuid(), os.getgid())
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
_private_pool: WorkspacePool | None = None
_private_lock = threading.Lock()


def private_pool() -> WorkspacePool:
    """The pool of the directories of jobs that run as another account than the worker's: made in
    a directory of the worker's own that others may pass through but not list or change (0711), so
    no job can rename its directory away and leave a symlink for the worker to follow."""
    global _private_pool
    with _private_lock:
        if _private_pool is None:
            parent = Path(tempfile.gettempdir()) / f"corral-jobs-{os.getuid()}"
            parent.mkdir(mode=0o711, exist_ok=True)
            status = os.lstat(parent)
            if not stat.S_ISDIR(status.st_mode) or status.st_uid != os.getuid():
                raise RuntimeError(f"{parent} is not a directory of the worker's own")
            os.chmod(parent, 0o711)  # noqa: S103 - traversable, neither listable nor writable
            _private_pool = WorkspacePool(parent=str(parent))
            atexit.register(_clear_private, _private_pool, parent)
        return _private_pool


def _clear_private(kept: WorkspacePool, parent: Path) -> None:
    kept.clear()
    with contextlib.suppress(OSError):
        parent.rmdir()  # unless another worker of this account still has directories there


class JobWorkspace:
    """``job_id`` and ``attempt`` no longer name the directory (a kept one served an earlier
    attempt): the job's log lines tie its paths to it."""

    def __init__(self, job_id: str, attempt: int, account: Account | None = None) -> None:
        foreign = account is not None and account.uid != os.getuid()
        self._pool = private_pool() if foreign else pool
        self._name: str | None = self._pool.take()
        #: the account the job runs as, when not the worker's: its files are that account's
        self.owner: Account | None = account if foreign else None
        if self.owner is not None:
            os.chown(self._name, self.owner.uid, self.owner.gid)
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
            self.hand_over(self.gang_checkpoint_dir)
            environment["CORRAL_GANG_CHECKPOINT_DIR"] = str(self.gang_checkpoint_dir)
        else:
            environment.pop("CORRAL_GANG_CHECKPOINT_DIR", None)
        return environment

    def hand_over(self, path: Path) -> None:
        """What the worker put in the directory for the job (a checkpoint to resume from, the gang's
        checkpoints) belongs to the job's account; nothing to do for a job run as the worker."""
        if self.owner is None or not os.path.lexists(path):
            return
        os.chown(path, self.owner.uid, self.owner.gid, follow_symlinks=False)
        if path.is_dir() and not path.is_symlink():
            for child in path.iterdir():
                os.chown(child, self.owner.uid, self.owner.gid, follow_symlinks=False)

    def remove(self) -> None:
        """The attempt ended: its directory goes back to the pool when it is empty, else is removed."""
        # Idempotent: a directory given back twice would be handed to two attempts.
        name, self._name = self._name, None
        if name is not None:
            self._pool.give_back(name)
