"""Moving a job's checkpoint between its workspace and the server: bytes end to end, never text.

Why the worker carries checkpoints and not the job: a job only writes one file
(``CORRAL_CHECKPOINT_OUT``) and reads others (``CORRAL_CHECKPOINT_IN``, and for a gang rank the
files in ``CORRAL_GANG_CHECKPOINT_DIR``). It needs no HTTP client, no token, no idea of attempts or
preemption epochs, and a shell job can checkpoint with ``cat``.

The upload happens at every end of an attempt, not only at a stop the server asked for: a rank
that crashes, the rank whose crash starts a gang's drain, a rank whose collective fails on its own
a moment later (long before a heartbeat could tell it to stop), a job that exits 0, a watchdog
trip, a shutdown hand-back. Any of them may be the only state the next attempt can resume from;
a gang whose ranks all die on their own would otherwise restart from scratch, crash at the same
step, and fail once out of retries. Only a job that was lost (another attempt owns it) uploads
nothing: the server would refuse it, and what it wrote is not the current attempt's.

The upload happens after the job's process group is gone, so nothing can still be writing the
file, and before the attempt's final report (done, fail, watchdog, the ``/preempted`` ack): the
server accepts an attempt's checkpoint only until that report, and the report may be the one that
completes the gang's drain, after which the next attempt can be claimed at once and its claim must
find the checkpoint stored. A stop the server asked for uploads with its preemption epoch (the
server checks it against the drain); every other end uploads without one, fenced by the attempt.
A refused upload (413 too large, 409 stale) is logged and the report still goes: a gang that
restarts from an older checkpoint (or from scratch) is better than a gang stuck in its drain.

A preemption's checkpoint phase adds one upload before the end: when the job says its save is done
(``corral.worker.checkpoint_phase``), what it wrote goes up at once with the phase's epoch, which
ends the phase on the server. The attempt's uploads then go through one ``AttemptUploads``: one at a
time (the phase's upload and the end's never race), the same bytes never twice (the end skips a file
the phase already uploaded; anything the job saved since goes up), and none after the end's.

The downloads happen before the process starts: the job's own checkpoint when the claim says
``CORRAL_RESUME=1``, where the server's copy is the source (it has no size limit but the
server's) and the claim's inline ``CHECKPOINT_DATA`` (small checkpoints only) the fallback when
the server cannot be reached; and for a gang rank, every rank's checkpoint the claim lists in
``gang_checkpoints``, each as ``rank-<gang_index>``, so "rank 0 saves, every rank loads" works. A
peer's checkpoint that cannot be fetched is logged and the job starts anyway: it can still resume
from what it has, and a job held back by a transfer helps nobody.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import logging
import os
import shutil
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from corral.worker import job_files
from corral.worker.calls import WorkerClient
from corral.worker.reporting import deliver

logger = logging.getLogger("corral.worker.checkpoints")

#: A transfer is tried this many times (backoff 0.5, 1, 2 s): a stopping job's ack, and a starting
#: job's process, should not wait long for a server that does not answer.
TRANSFER_TRIES = 4
#: A checkpoint file larger than this is not read into the worker's memory to be uploaded. The
#: server refuses anything above ``CORRAL_CHECKPOINT_MAX_BYTES`` (16 MiB by default) anyway; this
#: only keeps a runaway file from exhausting the worker's memory.
MAX_UPLOAD_BYTES = 1 << 30


def read_written(path: Path, fields: Mapping[str, Any], owner: int | None = None) -> bytes | None:
    """The checkpoint the job left at ``path``; None when it wrote none (absent or empty file).

    Only a regular file that is not a symlink (and, with ``owner``, one that account owns) is read:
    a FIFO would hang the worker, ``/dev/zero`` never end, and a link to a file the job itself may not
    read would upload it (``corral.worker.job_files``)."""
    opened = job_files.open_regular(path, owner)
    if opened is None:
        if os.path.lexists(path):
            logger.warning(
                "the job's checkpoint is not a regular file of its own; not uploaded",
                extra={**fields, "path": str(path)},
            )
        return None
    descriptor, status = opened
    os.close(descriptor)
    if status.st_size == 0:
        return None
    if status.st_size > MAX_UPLOAD_BYTES:
        logger.error(
            "the job's checkpoint is too large to upload; dropped",
            extra={**fields, "bytes": status.st_size, "max_bytes": MAX_UPLOAD_BYTES},
        )
        return None
    return job_files.read_whole(path, MAX_UPLOAD_BYTES, owner)


def upload(
    client: WorkerClient,
    job_id: str,
    worker_id: str,
    attempt: int,
    epoch: int | None,
    path: Path,
    fields: Mapping[str, Any],
    tries: int = TRANSFER_TRIES,
) -> bool:
    """Upload the checkpoint the ended job wrote at ``path``: for preemption ``epoch`` when the
    attempt ended in a stop the server asked for, else (None) for the attempt however it ended.

    True when the server stored it; False when there was none or the upload failed (logged).
    """
    data = read_written(path, fields)
    if data is None:
        return False
    return _send(client, job_id, worker_id, attempt, epoch, data, fields, tries)


def _send(
    client: WorkerClient,
    job_id: str,
    worker_id: str,
    attempt: int,
    epoch: int | None,
    data: bytes,
    fields: Mapping[str, Any],
    tries: int,
) -> bool:
    fields = {**fields, "preemption_epoch": epoch, "bytes": len(data)}

    def send() -> dict[str, Any]:
        client.upload_checkpoint(job_id, worker_id, attempt, epoch, data)
        return {}

    stored = deliver(send, "checkpoint upload", fields, tries=tries) is not None
    if stored:
        logger.info("checkpoint uploaded", extra=fields)
    return stored


class AttemptUploads:
    """The uploads of one attempt's checkpoint file: one at a time, the same bytes never twice,
    nothing after the final one (the attempt's end, just before its report).

    Why by content and not by the file's modification time: a shell job rewrites the file in place,
    and two writes within one clock tick of the file system leave the same time behind.
    """

    def __init__(
        self,
        client: WorkerClient,
        job_id: str,
        worker_id: str,
        attempt: int,
        path: Path,
        fields: Mapping[str, Any],
        tries: int = TRANSFER_TRIES,
        owner: int | None = None,
    ) -> None:
        """``owner``: the uid the checkpoint file must belong to (a job run as another account)."""
        self._owner = owner
        self._client = client
        self._job_id, self._worker_id, self._attempt = job_id, worker_id, attempt
        self.path = path
        self._fields = dict(fields)
        self._tries = tries
        self._lock = threading.Lock()
        self._stored_digest: bytes | None = None
        self._closed = False

    @property
    def closed(self) -> bool:
        return self._closed

    def upload(self, epoch: int | None, final: bool = False) -> bool:
        """Upload what the file holds now, for ``epoch`` (None: for the attempt however it ends).

        True when the server has these bytes (stored now or by an earlier upload of this attempt);
        False when there is nothing to send, the upload failed, or the final upload was made
        already. ``final``: the attempt's last, made after its process group is gone.
        """
        with self._lock:
            if self._closed:
                return False
            if final:
                self._closed = True
            data = read_written(self.path, self._fields, self._owner)
            if data is None:
                return False
            digest = hashlib.blake2b(data, digest_size=16).digest()
            if digest == self._stored_digest:
                logger.info(
                    "checkpoint unchanged since its upload; not sent again",
                    extra={**self._fields, "preemption_epoch": epoch, "bytes": len(data)},
                )
                return True
            stored = _send(
                self._client,
                self._job_id,
                self._worker_id,
                self._attempt,
                epoch,
                data,
                self._fields,
                self._tries,
            )
            if stored:
                self._stored_digest = digest
            return stored


def download(
    client: WorkerClient,
    job_id: str,
    claim_env: Mapping[str, str],
    destination: Path,
    fields: Mapping[str, Any],
    tries: int = TRANSFER_TRIES,
) -> bool:
    """Write the job's stored checkpoint to ``destination`` when the claim says there is one.

    True when ``destination`` now holds it; False when the job starts without one (no checkpoint
    stored, or neither the server nor the claim's ``CHECKPOINT_DATA`` could provide it).
    """
    if claim_env.get("CORRAL_RESUME") != "1":
        return False

    def fetch() -> dict[str, Any]:
        return {"data": client.download_checkpoint(job_id)}

    answer = deliver(fetch, "checkpoint download", fields, tries=tries)
    data: bytes | None = answer["data"] if answer is not None else None
    source = "server"
    if data is None:
        data = _inline(claim_env, fields)
        source = "claim"
    if data is None:
        logger.warning("resuming without a checkpoint: none could be fetched", extra=fields)
        return False
    destination.write_bytes(data)
    logger.info("checkpoint downloaded", extra={**fields, "bytes": len(data), "source": source})
    return True


def download_gang(
    client: WorkerClient,
    ranks: list[tuple[int, str]],
    directory: Path,
    own: tuple[str, Path] | None,
    fields: Mapping[str, Any],
    tries: int = TRANSFER_TRIES,
) -> list[int]:
    """Write each listed rank's stored checkpoint to ``directory/rank-<gang_index>``; the ranks
    written, in order.

    ``own``: the job's id and the file its own checkpoint was already downloaded to, copied rather
    than fetched twice. A rank whose checkpoint cannot be fetched is logged and left out; once one
    transfer has failed every try (the server is unreachable or failing), the rest get one try
    each, so a large gang does not hold its start for minutes of backoff.
    """
    written = []
    for index, job_id in ranks:
        target = directory / f"rank-{index}"
        rank_fields = {**fields, "gang_index": index, "rank_job_id": job_id}
        if own is not None and own[0] == job_id:
            shutil.copyfile(own[1], target)
            written.append(index)
            continue

        def fetch(job_id: str = job_id) -> dict[str, Any]:
            return {"data": client.download_checkpoint(job_id)}

        answer = deliver(fetch, "gang checkpoint download", rank_fields, tries=tries)
        if answer is None:
            tries = 1
            logger.warning(
                "starting without this rank's checkpoint: it could not be fetched", extra=rank_fields
            )
            continue
        data: bytes | None = answer["data"]
        if not data:
            logger.warning("the server has no checkpoint for this rank any more", extra=rank_fields)
            continue
        target.write_bytes(data)
        written.append(index)
    if written:
        logger.info("gang checkpoints downloaded", extra={**fields, "ranks": written})
    return written


def _inline(claim_env: Mapping[str, str], fields: Mapping[str, Any]) -> bytes | None:
    """The claim's ``CHECKPOINT_DATA`` decoded, or None (absent, empty or not base64)."""
    inline = claim_env.get("CHECKPOINT_DATA")
    if not inline:
        return None
    try:
        return base64.b64decode(inline, validate=True) or None
    except (binascii.Error, ValueError):
        logger.warning("CHECKPOINT_DATA is not valid base64; ignored", extra=fields)
        return None
