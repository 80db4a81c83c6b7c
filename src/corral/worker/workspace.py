"""A job's private directory and the environment it runs with.

Every attempt gets a fresh temporary directory for the files corral hands to the job (the beat
file, where a checkpoint goes, the stored checkpoint to resume from, for a gang rank the
directory of every rank's checkpoint, and the two files of a preemption's checkpoint phase: the one
the job touches when the save SIGUSR1 asked for is complete, and the one it writes a number of
seconds to when it needs more time); it is removed when the attempt ends, so nothing of one attempt
leaks into the next or piles up on the host.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path


def visible_devices(gpu_indices: Sequence[int]) -> str:
    """``CUDA_VISIBLE_DEVICES`` for the GPUs the server gave the job; empty for a job without GPUs
    (an empty value hides every GPU, where an unset one would expose them all)."""
    return ",".join(str(index) for index in gpu_indices)


class JobWorkspace:
    def __init__(self, job_id: str, attempt: int) -> None:
        self.directory = Path(tempfile.mkdtemp(prefix=f"corral-{job_id}-{attempt}-"))
        self.beat_file = self.directory / "beat"
        self.checkpoint_out = self.directory / "checkpoint.out"
        self.checkpoint_in = self.directory / "checkpoint.in"
        self.gang_checkpoint_dir = self.directory / "gang-checkpoints"
        self.checkpoint_done_file = self.directory / "checkpoint.done"
        self.defer_file = self.directory / "defer"

    def environment(
        self, claim_env: Mapping[str, str], gpu_indices: Sequence[int], has_checkpoint_in: bool
    ) -> dict[str, str]:
        """The worker's environment, then the claim's ``env``, then the variables the worker owns.

        A gang rank (the claim has ``CORRAL_GANG_ID``) always gets ``CORRAL_GANG_CHECKPOINT_DIR``,
        created here, empty when no rank has a checkpoint yet: a job can test for a file in it
        without first testing the variable.
        """
        environment = {**os.environ, **{str(key): str(value) for key, value in claim_env.items()}}
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
        # Most jobs leave nothing here: one rmdir, without rmtree's walk.
        try:
            os.rmdir(self.directory)
        except OSError:
            shutil.rmtree(self.directory, ignore_errors=True)
